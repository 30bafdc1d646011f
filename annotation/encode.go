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

// encodedSize is an upper bound of the encoding's length when no string needs escaping, so
// that the common case allocates once.
func encodedSize(devices []Device, shape Shape) int {
	n := 2
	for i := range devices {
		d := &devices[i]
		n += 150 + len(d.ID) + len(d.Type) + len(d.Mode)
		for _, p := range d.MIGProfiles {
			n += 96 + len(p.Name) + 32*len(p.Placements)
		}
	}
	if shape == ShapeV290 {
		n += 20 * len(devices)
	}
	return n
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
	// lead is written before each key: '{' before the first, ',' before the others.
	lead := byte('{')
	if d.ID != "" {
		dst = append(dst, lead)
		lead = ','
		dst = append(dst, `"id":`...)
		dst = appendString(dst, d.ID)
	}
	if d.Index != 0 {
		dst = append(dst, lead)
		lead = ','
		dst = append(dst, `"index":`...)
		dst = strconv.AppendUint(dst, uint64(d.Index), 10)
	}
	if d.Count != 0 {
		dst = append(dst, lead)
		lead = ','
		dst = append(dst, `"count":`...)
		dst = strconv.AppendInt(dst, int64(d.Count), 10)
	}
	if d.Devmem != 0 {
		dst = append(dst, lead)
		lead = ','
		dst = append(dst, `"devmem":`...)
		dst = strconv.AppendInt(dst, int64(d.Devmem), 10)
	}
	if d.Devcore != 0 {
		dst = append(dst, lead)
		lead = ','
		dst = append(dst, `"devcore":`...)
		dst = strconv.AppendInt(dst, int64(d.Devcore), 10)
	}
	if d.Type != "" {
		dst = append(dst, lead)
		lead = ','
		dst = append(dst, `"type":`...)
		dst = appendRepeated(dst, d.Type, &st.typ, &st.hasType, &st.typStart, &st.typEnd)
	}
	if d.Numa != 0 {
		dst = append(dst, lead)
		lead = ','
		dst = append(dst, `"numa":`...)
		dst = strconv.AppendInt(dst, int64(d.Numa), 10)
	}
	if d.Mode != "" {
		dst = append(dst, lead)
		lead = ','
		dst = append(dst, `"mode":`...)
		dst = appendRepeated(dst, d.Mode, &st.mode, &st.hasMode, &st.modeStart, &st.modeEnd)
	}
	if shape == ShapeMaster && len(d.MIGProfiles) > 0 {
		dst = append(dst, lead)
		lead = ','
		dst = append(dst, `"migProfiles":`...)
		dst = appendMigProfiles(dst, d.MIGProfiles)
	}
	if d.Health {
		dst = append(dst, lead)
		lead = ','
		dst = append(dst, `"health":true`...)
	}
	if shape == ShapeV290 {
		dst = append(dst, lead)
		lead = ','
		dst = append(dst, `"devicepairscore":{}`...)
	}
	if lead == '{' {
		dst = append(dst, '{')
	}
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

// appendString appends s as a JSON string with encoding/json's HTML-safe escaping: quotes and
// backslashes escaped, control characters as \b \f \n \r \t or \u00XX, '<' '>' '&' as \u003c
// \u003e \u0026, U+2028 and U+2029 escaped, invalid UTF-8 replaced by \ufffd.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
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
