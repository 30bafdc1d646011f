package annotation

import (
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// Encode returns the register annotation value HAMi master's node agent writes for devices,
// byte for byte: compact JSON, keys in HAMi's order, zero values omitted, Go's HTML-safe string
// escaping. Devices are written in the order given; writers should pass them in canonical order
// ([SortDevices]) so that an unchanged device set always encodes to the same value. A nil or
// empty list encodes to "[]".
func Encode(devices []Device) string {
	return EncodeShape(devices, ShapeMaster)
}

// EncodeShape is [Encode] in the given HAMi version's shape: [ShapeV290] appends
// "devicepairscore":{} to every device and never writes "migProfiles".
func EncodeShape(devices []Device, shape Shape) string {
	buf := AppendEncode(make([]byte, 0, encodedSize(devices, shape)), devices, shape)
	// buf is not referenced after this: hand its bytes to the string without a copy, as
	// strings.Builder does.
	return unsafe.String(unsafe.SliceData(buf), len(buf))
}

// encodedSize is the encoding's exact length when no string needs escaping (escaping only
// lengthens it, and append then grows the buffer), so that the common case allocates once and
// no more than the result needs: allocation dominates the cost of Encode.
func encodedSize(devices []Device, shape Shape) int {
	n := 2 // brackets
	for i := range devices {
		d := &devices[i]
		start := n
		if i > 0 {
			n++ // ',' between devices
		}
		n++ // '}'; each key below counts the '{' or ',' before it
		if d.ID != "" {
			n += len(`,"id":""`) + len(d.ID)
		}
		if d.Index != 0 {
			n += len(`,"index":`) + digits(uint64(d.Index))
		}
		if d.Count != 0 {
			n += len(`,"count":`) + intLen(int64(d.Count))
		}
		if d.Devmem != 0 {
			n += len(`,"devmem":`) + intLen(int64(d.Devmem))
		}
		if d.Devcore != 0 {
			n += len(`,"devcore":`) + intLen(int64(d.Devcore))
		}
		if d.Type != "" {
			n += len(`,"type":""`) + len(d.Type)
		}
		if d.Numa != 0 {
			n += len(`,"numa":`) + intLen(int64(d.Numa))
		}
		if d.Mode != "" {
			n += len(`,"mode":""`) + len(d.Mode)
		}
		if d.Health {
			n += len(`,"health":true`)
		}
		if shape == ShapeV290 {
			n += len(`,"devicepairscore":{}`)
		} else if len(d.MIGProfiles) > 0 {
			n += len(`,"migProfiles":[]`)
			for _, p := range d.MIGProfiles {
				n += 96 + len(p.Name) + 32*len(p.Placements) // an upper bound: rare, not worth exact
			}
		}
		if n == start+1+min(i, 1) {
			n++ // no key: "{}"
		}
	}
	return n
}

// digits is the number of decimal digits of v.
func digits(v uint64) int {
	switch {
	case v < 10:
		return 1
	case v < 100:
		return 2
	case v < 1000:
		return 3
	case v < 100000:
		if v < 10000 {
			return 4
		}
		return 5
	}
	n := 6
	for v /= 1000000; v > 0; v /= 10 {
		n++
	}
	return n
}

// intLen is the length of v in decimal, with its sign.
func intLen(v int64) int {
	if v < 0 {
		return 1 + digits(uint64(-v))
	}
	return digits(uint64(v))
}

// AppendEncode appends the encoding of devices in the given shape to dst and returns the
// extended buffer.
func AppendEncode(dst []byte, devices []Device, shape Shape) []byte {
	dst = append(dst, '[')
	var st encState
	for i := range devices {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = st.appendDevice(dst, &devices[i], shape)
	}
	return append(dst, ']')
}

// encState remembers where the previous device's model and mode were written, escaped, so
// that the next device with the same model or mode (all GPUs of a node, usually) copies those
// bytes instead of escaping the string again.
type encState struct {
	typ, mode          string
	typStart, typEnd   int
	modeStart, modeEnd int
	hasType, hasMode   bool
}

// appendRepeated appends s as a JSON string, copying dst[*start:*end] when s equals last.
func appendRepeated(dst []byte, s string, last *string, has *bool, start, end *int) []byte {
	if *has && s == *last {
		return append(dst, dst[*start:*end]...)
	}
	*start = len(dst)
	dst = appendString(dst, s)
	*end = len(dst)
	*last, *has = s, true
	return dst
}

func (st *encState) appendDevice(dst []byte, d *Device, shape Shape) []byte {
	// Every key is written with a leading ','; before the first key it becomes '{'.
	first := len(dst)
	if d.ID != "" {
		dst = append(dst, `,"id":`...)
		dst = appendString(dst, d.ID)
	}
	if d.Index != 0 {
		dst = append(dst, `,"index":`...)
		dst = strconv.AppendUint(dst, uint64(d.Index), 10)
	}
	if d.Count != 0 {
		dst = append(dst, `,"count":`...)
		dst = strconv.AppendInt(dst, int64(d.Count), 10)
	}
	if d.Devmem != 0 {
		dst = append(dst, `,"devmem":`...)
		dst = strconv.AppendInt(dst, int64(d.Devmem), 10)
	}
	if d.Devcore != 0 {
		dst = append(dst, `,"devcore":`...)
		dst = strconv.AppendInt(dst, int64(d.Devcore), 10)
	}
	if d.Type != "" {
		dst = append(dst, `,"type":`...)
		dst = appendRepeated(dst, d.Type, &st.typ, &st.hasType, &st.typStart, &st.typEnd)
	}
	if d.Numa != 0 {
		dst = append(dst, `,"numa":`...)
		dst = strconv.AppendInt(dst, int64(d.Numa), 10)
	}
	if d.Mode != "" {
		dst = append(dst, `,"mode":`...)
		dst = appendRepeated(dst, d.Mode, &st.mode, &st.hasMode, &st.modeStart, &st.modeEnd)
	}
	if shape == ShapeMaster && len(d.MIGProfiles) > 0 {
		dst = append(dst, `,"migProfiles":`...)
		dst = appendMigProfiles(dst, d.MIGProfiles)
	}
	if d.Health {
		dst = append(dst, `,"health":true`...)
	}
	if shape == ShapeV290 {
		dst = append(dst, `,"devicepairscore":{}`...)
	}
	if len(dst) == first {
		return append(dst, '{', '}')
	}
	dst[first] = '{'
	return append(dst, '}')
}

func appendMigProfiles(dst []byte, ps []MigProfile) []byte {
	dst = append(dst, '[')
	for i, p := range ps {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"name":`...)
		dst = appendString(dst, p.Name)
		dst = append(dst, `,"memoryMB":`...)
		dst = strconv.AppendInt(dst, int64(p.MemoryMB), 10)
		dst = append(dst, `,"core":`...)
		dst = strconv.AppendInt(dst, int64(p.Core), 10)
		dst = append(dst, `,"sliceCount":`...)
		dst = strconv.AppendUint(dst, uint64(p.SliceCount), 10)
		dst = append(dst, `,"placements":`...)
		if p.Placements == nil {
			dst = append(dst, "null"...)
		} else {
			dst = append(dst, '[')
			for j, pl := range p.Placements {
				if j > 0 {
					dst = append(dst, ',')
				}
				dst = append(dst, `{"start":`...)
				dst = strconv.AppendUint(dst, uint64(pl.Start), 10)
				dst = append(dst, `,"size":`...)
				dst = strconv.AppendUint(dst, uint64(pl.Size), 10)
				dst = append(dst, '}')
			}
			dst = append(dst, ']')
		}
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

const hexDigits = "0123456789abcdef"

// htmlSafeLo and htmlSafeHi are bitmaps of the ASCII bytes encoding/json writes unescaped with
// HTML escaping on: 0x20-0x7f except '"', '&', '<', '>' and '\\'.
const (
	htmlSafeLo uint64 = 0xAFFFFFBB00000000 // bytes 0-63: 0x20-0x3f without '"' '&' '<' '>'
	htmlSafeHi uint64 = 0xFFFFFFFFEFFFFFFF // bytes 64-127: all but '\\' (92)
)

// htmlSafe reports whether encoding/json writes the ASCII byte c unescaped with HTML escaping on.
func htmlSafe(c byte) bool {
	if c < 64 {
		return htmlSafeLo>>c&1 != 0
	}
	return htmlSafeHi>>(c&63)&1 != 0
}

// SWAR constants: one bit or value per byte of a uint64.
const (
	swarOnes = 0x0101010101010101
	swarHigh = 0x8080808080808080
)

// unsafe8 is non-zero when one of the eight bytes of x (from a string) is a byte that
// encoding/json escapes: non-ASCII, below 0x20, '"', '&', '<', '>' or '\\'. Setting bit 2
// maps '"' (0x22) onto '&' (0x26) and setting bit 1 maps '<' (0x3c) onto '>' (0x3e), and no
// other byte onto either, so three equality tests cover the five characters.
func unsafe8(x uint64) uint64 {
	q := x | swarOnes*0x04 ^ swarOnes*'&'
	a := x | swarOnes*0x02 ^ swarOnes*'>'
	b := x ^ swarOnes*'\\'
	return ((x - swarOnes*0x20) | x | (q-swarOnes)&^q | (a-swarOnes)&^a | (b-swarOnes)&^b) & swarHigh
}

// load8 reads s[i:i+8] as a little-endian uint64 (the compiler makes it one load).
func load8(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// appendString appends s as a JSON string with encoding/json's HTML-safe escaping: quotes and
// backslashes escaped, control characters as \b \f \n \r \t or \u00XX, '<' '>' '&' as \u003c
// \u003e \u0026, U+2028 and U+2029 escaped, invalid UTF-8 replaced by \ufffd. Runs of safe
// bytes are skipped eight at a time.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		for i+8 <= len(s) && unsafe8(load8(s, i)) == 0 {
			i += 8
		}
		if i >= len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			if htmlSafe(c) {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
