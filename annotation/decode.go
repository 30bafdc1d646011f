package annotation

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Shape selects which HAMi version's wire struct the codec follows.
type Shape int

const (
	// ShapeMaster is HAMi master (v2.10): no "devicepairscore", optional "migProfiles".
	// It is the default.
	ShapeMaster Shape = iota
	// ShapeV290 is HAMi v2.9.0: every element carries "devicepairscore":{}, no "migProfiles".
	ShapeV290
)

// String returns "master" or "v2.9.0".
func (s Shape) String() string {
	if s == ShapeV290 {
		return "v2.9.0"
	}
	return "master"
}

// maxDepth is the nesting limit of Go's encoding/json, which HAMi's decoder inherits.
const maxDepth = 10000

// Decode parses a register annotation value the way HAMi master's scheduler does
// (encoding/json into its device struct) and returns the devices in the order written.
//
// It accepts exactly what HAMi accepts: keys match case-insensitively, a duplicated key's last
// value wins, unknown keys are ignored, whitespace is free, numbers must be integers in the
// range of the field's type (no floats, exponents or quoted numbers), and "null" or "[]" give
// no devices without an error (nil for "null", an empty slice for "[]"). Fields HAMi knows but
// this package does not expose (custominfo, devicevendor, migtemplate) are still type-checked,
// so a value HAMi rejects is rejected here too.
//
// Failures are classified: a [*DecodeError] wrapping [ErrMalformed] (with the byte offset and
// cause) for anything HAMi's decoder rejects, and [ErrInvalidElement] for a null element, which
// HAMi accepts and then crashes on. Decode never panics.
func Decode(value string) ([]Device, error) {
	return DecodeShape(value, ShapeMaster)
}

// DecodeShape is [Decode] for the given HAMi version's struct shape: with [ShapeV290] the
// "devicepairscore" object is type-checked and "migProfiles" ignored, as v2.9.0 does.
func DecodeShape(value string, shape Shape) ([]Device, error) {
	d := decoder{s: value, shape: shape}
	devs := d.top()
	if err := d.result(); err != nil {
		return nil, err
	}
	return devs, nil
}

// decoder is a single-pass JSON reader specialised for the register annotation. It validates
// the complete syntax (as encoding/json does before decoding) and records the first type error
// and the first null element, which rank below syntax errors.
type decoder struct {
	s     string
	i     int
	depth int
	shape Shape

	syntax  *DecodeError // first syntax error; decoding stops
	typeErr *DecodeError // first value error; decoding goes on
	nullErr *DecodeError // first null element

	elem  int    // current device element, -1 outside
	field string // current device field
}

func (d *decoder) result() error {
	switch {
	case d.syntax != nil:
		return d.syntax
	case d.typeErr != nil:
		return d.typeErr
	case d.nullErr != nil:
		return d.nullErr
	}
	return nil
}

func (d *decoder) failed() bool { return d.syntax != nil }

func (d *decoder) syntaxErr(msg string) {
	if d.syntax == nil {
		d.syntax = &DecodeError{Kind: ErrMalformed, Offset: d.i, Element: -1, Msg: msg}
	}
}

// unexpected records a syntax error for the byte at the cursor (or the end of input).
func (d *decoder) unexpected(context string) {
	if d.i >= len(d.s) {
		d.syntaxErr("unexpected end of JSON input")
		return
	}
	d.syntaxErr("invalid character " + quoteChar(d.s[d.i]) + " " + context)
}

func quoteChar(c byte) string {
	switch {
	case c == '\'':
		return `'\''`
	case c == '"':
		return `'"'`
	case c < 0x20 || c >= 0x7f:
		return strconv.QuoteRune(rune(c))
	default:
		return "'" + string(rune(c)) + "'"
	}
}

func (d *decoder) mismatch(offset int, msg string) {
	if d.typeErr == nil {
		d.typeErr = &DecodeError{Kind: ErrMalformed, Offset: offset, Element: d.elem, Field: d.field, Msg: msg}
	}
}

func (d *decoder) ws() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *decoder) peek() byte {
	if d.i < len(d.s) {
		return d.s[d.i]
	}
	return 0
}

func (d *decoder) push() bool {
	d.depth++
	if d.depth > maxDepth {
		d.syntaxErr("exceeded max depth")
		return false
	}
	return true
}

func (d *decoder) pop() { d.depth-- }

// top decodes the whole value into a device list.
func (d *decoder) top() []Device {
	d.elem = -1
	d.ws()
	var devs []Device
	switch d.peek() {
	case 'n':
		d.literal("null")
	case '[':
		devs = d.deviceArray()
	default:
		start := d.i
		if kind := d.skipValue(); kind != "" {
			d.mismatch(start, "cannot decode "+kind+" into a device list")
		}
	}
	if d.failed() {
		return nil
	}
	d.ws()
	if d.i < len(d.s) {
		d.unexpected("after top-level value")
	}
	return devs
}

func (d *decoder) deviceArray() []Device {
	if !d.push() {
		return nil
	}
	d.i++ // '['
	devs := []Device{}
	d.ws()
	if d.peek() == ']' {
		d.i++
		d.pop()
		return devs
	}
	for n := 0; ; n++ {
		d.ws()
		start := d.i
		d.elem = n
		switch d.peek() {
		case '{':
			devs = append(devs, Device{})
			d.deviceObject(&devs[len(devs)-1])
		case 'n':
			if d.literal("null") && d.nullErr == nil {
				d.nullErr = &DecodeError{Kind: ErrInvalidElement, Offset: start, Element: n, Msg: "null element (HAMi's scheduler crashes on it)"}
			}
			devs = append(devs, Device{})
		default:
			if kind := d.skipValue(); kind != "" {
				d.mismatch(start, "cannot decode "+kind+" into a device")
			}
			devs = append(devs, Device{})
		}
		d.elem = -1
		if d.failed() {
			return nil
		}
		d.ws()
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			d.pop()
			return devs
		default:
			d.unexpected("after array element")
			return nil
		}
	}
}

// Device fields, in HAMi's struct order.
const (
	fUnknown = iota
	fID
	fIndex
	fCount
	fDevmem
	fDevcore
	fType
	fNuma
	fMode
	fMIGProfiles
	fMIGTemplate
	fHealth
	fDeviceVendor
	fCustomInfo
	fDevicePairScore
)

var deviceFieldNames = [...]string{
	fID: "id", fIndex: "index", fCount: "count", fDevmem: "devmem", fDevcore: "devcore",
	fType: "type", fNuma: "numa", fMode: "mode", fMIGProfiles: "migProfiles",
	fMIGTemplate: "migtemplate", fHealth: "health", fDeviceVendor: "devicevendor",
	fCustomInfo: "custominfo", fDevicePairScore: "devicepairscore",
}

func deviceField(key string) int {
	switch key { // exact names first: what every writer produces
	case "id":
		return fID
	case "index":
		return fIndex
	case "count":
		return fCount
	case "devmem":
		return fDevmem
	case "devcore":
		return fDevcore
	case "type":
		return fType
	case "numa":
		return fNuma
	case "mode":
		return fMode
	case "health":
		return fHealth
	}
	return foldMatch(key, deviceFieldNames[:])
}

// foldMatch returns the index in names of the name that key matches under encoding/json's
// case folding, or 0 (names[0] is unused).
func foldMatch(key string, names []string) int {
	ascii := true
	for i := 0; i < len(key); i++ {
		if key[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		for i, n := range names {
			if n != "" && len(n) == len(key) && asciiEqualFold(key, n) {
				return i
			}
		}
		return 0
	}
	folded := foldName(key)
	for i, n := range names {
		if n != "" && folded == foldName(n) {
			return i
		}
	}
	return 0
}

func asciiEqualFold(a, b string) bool {
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'a' <= x && x <= 'z' {
			x -= 'a' - 'A'
		}
		if 'a' <= y && y <= 'z' {
			y -= 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// foldName maps a key to its case-folded form the way encoding/json matches struct fields:
// ASCII letters upper-cased, other runes mapped through ToUpper(ToLower(r)), so that for
// example "ſ" matches "s" and "K" (Kelvin) matches "k".
func foldName(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r < utf8.RuneSelf {
			if 'a' <= r && r <= 'z' {
				r -= 'a' - 'A'
			}
			b.WriteByte(byte(r))
			continue
		}
		b.WriteRune(unicode.ToUpper(unicode.ToLower(r)))
	}
	return b.String()
}

// object walks an object, calling member for each key with the cursor on the value. member
// must consume the value. A null is consumed as nothing; any other kind of value is skipped
// with a type error naming what.
func (d *decoder) object(what string, member func(key string)) {
	start := d.i
	switch d.peek() {
	case '{':
	case 'n':
		d.literal("null")
		return
	default:
		if kind := d.skipValue(); kind != "" {
			d.mismatch(start, "cannot decode "+kind+" into "+what)
		}
		return
	}
	if !d.push() {
		return
	}
	d.i++
	d.ws()
	if d.peek() == '}' {
		d.i++
		d.pop()
		return
	}
	for {
		d.ws()
		if d.peek() != '"' {
			d.unexpected("looking for beginning of object key string")
			return
		}
		key, ok := d.str()
		if !ok {
			return
		}
		d.ws()
		if d.peek() != ':' {
			d.unexpected("after object key")
			return
		}
		d.i++
		d.ws()
		member(key)
		if d.failed() {
			return
		}
		d.ws()
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			d.pop()
			return
		default:
			d.unexpected("after object key:value pair")
			return
		}
	}
}

func (d *decoder) deviceObject(dev *Device) {
	d.object("a device", func(key string) {
		f := deviceField(key)
		d.field = deviceFieldNames[f]
		switch f {
		case fID:
			d.stringField(&dev.ID)
		case fType:
			d.stringField(&dev.Type)
		case fMode:
			d.stringField(&dev.Mode)
		case fDeviceVendor:
			var ignored string
			d.stringField(&ignored)
		case fIndex:
			d.uintField(&dev.Index)
		case fCount:
			d.int32Field(&dev.Count)
		case fDevmem:
			d.int32Field(&dev.Devmem)
		case fDevcore:
			d.int32Field(&dev.Devcore)
		case fNuma:
			d.intField(&dev.Numa)
		case fHealth:
			d.boolField(&dev.Health)
		case fCustomInfo:
			d.anyMap()
		case fMIGTemplate:
			d.migTemplates()
		case fMIGProfiles:
			if d.shape == ShapeMaster {
				decodeSlice(d, &dev.MIGProfiles, "MIG profiles", d.migProfile)
			} else {
				d.skipValue()
			}
		case fDevicePairScore:
			if d.shape == ShapeV290 {
				d.pairScore()
			} else {
				d.skipValue()
			}
		default:
			d.skipValue()
		}
		d.field = ""
	})
}

// decodeSlice decodes a JSON array into *dst with encoding/json's slice semantics: elements are
// decoded into the existing backing array (so a repeated key merges into the earlier value),
// null sets the slice to nil and an empty array gives an empty, non-nil slice.
func decodeSlice[T any](d *decoder, dst *[]T, what string, elem func(*T)) {
	start := d.i
	switch d.peek() {
	case '[':
	case 'n':
		if d.literal("null") {
			*dst = nil
		}
		return
	default:
		if kind := d.skipValue(); kind != "" {
			d.mismatch(start, "cannot decode "+kind+" into "+what)
		}
		return
	}
	if !d.push() {
		return
	}
	d.i++
	s := *dst
	n := 0
	d.ws()
	if d.peek() == ']' {
		d.i++
	} else {
		for {
			d.ws()
			if n == len(s) {
				if len(s) < cap(s) {
					s = s[:n+1]
				} else {
					var zero T
					s = append(s, zero)
				}
			}
			elem(&s[n])
			n++
			if d.failed() {
				return
			}
			d.ws()
			if d.peek() == ',' {
				d.i++
				continue
			}
			if d.peek() == ']' {
				d.i++
				break
			}
			d.unexpected("after array element")
			return
		}
	}
	d.pop()
	if n < len(s) {
		s = s[:n]
	}
	if n == 0 {
		s = make([]T, 0)
	}
	*dst = s
}

var migProfileNames = [...]string{1: "name", 2: "memoryMB", 3: "core", 4: "sliceCount", 5: "placements"}

func (d *decoder) migProfile(p *MigProfile) {
	d.object("a MIG profile", func(key string) {
		switch foldMatch(key, migProfileNames[:]) {
		case 1:
			d.stringField(&p.Name)
		case 2:
			d.int32Field(&p.MemoryMB)
		case 3:
			d.int32Field(&p.Core)
		case 4:
			d.uint32Field(&p.SliceCount)
		case 5:
			decodeSlice(d, &p.Placements, "MIG placements", d.migPlacement)
		default:
			d.skipValue()
		}
	})
}

var migPlacementNames = [...]string{1: "start", 2: "size"}

func (d *decoder) migPlacement(p *MigPlacement) {
	d.object("a MIG placement", func(key string) {
		switch foldMatch(key, migPlacementNames[:]) {
		case 1:
			d.uint32Field(&p.Start)
		case 2:
			d.uint32Field(&p.Size)
		default:
			d.skipValue()
		}
	})
}

// migTemplate mirrors HAMi's MigTemplate, which has no JSON tags: its keys are the Go field
// names, matched case-insensitively.
type migTemplate struct {
	name                string
	core, memory, count int32
}

var migTemplateNames = [...]string{1: "Name", 2: "Core", 3: "Memory", 4: "Count"}

func (d *decoder) migTemplates() {
	var geometries [][]migTemplate
	decodeSlice(d, &geometries, "MIG templates", func(g *[]migTemplate) {
		decodeSlice(d, g, "a MIG geometry", func(t *migTemplate) {
			d.object("a MIG template", func(key string) {
				switch foldMatch(key, migTemplateNames[:]) {
				case 1:
					d.stringField(&t.name)
				case 2:
					d.int32Field(&t.core)
				case 3:
					d.int32Field(&t.memory)
				case 4:
					d.int32Field(&t.count)
				default:
					d.skipValue()
				}
			})
		})
	})
}

var pairScoreNames = [...]string{1: "uuid", 2: "score"}

// pairScore type-checks v2.9.0's devicepairscore object {uuid string, score map[string]int}.
func (d *decoder) pairScore() {
	d.object("a device pair score", func(key string) {
		switch foldMatch(key, pairScoreNames[:]) {
		case 1:
			var id string
			d.stringField(&id)
		case 2:
			d.object("a score map", func(string) {
				var v int
				d.intField(&v)
			})
		default:
			d.skipValue()
		}
	})
}

// anyMap type-checks a map[string]any: an object (or null) whose numbers all fit a float64.
func (d *decoder) anyMap() {
	d.object("a custom info map", func(string) { d.anyValue() })
}

func (d *decoder) anyValue() {
	switch d.peek() {
	case '{':
		d.object("", func(string) { d.anyValue() })
	case '[':
		if !d.push() {
			return
		}
		d.i++
		d.ws()
		if d.peek() == ']' {
			d.i++
			d.pop()
			return
		}
		for {
			d.ws()
			d.anyValue()
			if d.failed() {
				return
			}
			d.ws()
			switch d.peek() {
			case ',':
				d.i++
			case ']':
				d.i++
				d.pop()
				return
			default:
				d.unexpected("after array element")
				return
			}
		}
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		start := d.i
		lit, ok := d.number()
		if ok {
			if _, err := strconv.ParseFloat(lit, 64); err != nil {
				d.mismatch(start, "number "+lit+" does not fit a float64")
			}
		}
	default:
		d.skipValue()
	}
}

// Scalar fields. Each consumes one value; null leaves the destination unchanged (as
// encoding/json does for non-pointer scalars); a value of another kind is a type error.

func (d *decoder) stringField(dst *string) {
	start := d.i
	if d.peek() == '"' {
		if s, ok := d.str(); ok {
			*dst = s
		}
		return
	}
	d.scalarMismatch(start, "string")
}

func (d *decoder) boolField(dst *bool) {
	start := d.i
	switch d.peek() {
	case 't':
		if d.literal("true") {
			*dst = true
		}
		return
	case 'f':
		if d.literal("false") {
			*dst = false
		}
		return
	}
	d.scalarMismatch(start, "bool")
}

func (d *decoder) scalarMismatch(start int, want string) {
	kind := d.skipValue()
	if kind != "" && kind != "null" {
		d.mismatch(start, "cannot decode "+kind+" into "+want)
	}
}

// numberLiteral consumes a number for an integer field, recording a type error for any other
// kind of value. It reports the literal and whether one was read.
func (d *decoder) numberLiteral(want string) (string, int, bool) {
	start := d.i
	c := d.peek()
	if c == '-' || ('0' <= c && c <= '9') {
		lit, ok := d.number()
		return lit, start, ok
	}
	d.scalarMismatch(start, want)
	return "", start, false
}

func (d *decoder) int32Field(dst *int32) {
	lit, start, ok := d.numberLiteral("int32")
	if !ok {
		return
	}
	n, err := parseInt(lit)
	if err || n < -1<<31 || n > 1<<31-1 {
		d.mismatch(start, "number "+lit+" is not an int32")
		return
	}
	*dst = int32(n)
}

func (d *decoder) intField(dst *int) {
	lit, start, ok := d.numberLiteral("int")
	if !ok {
		return
	}
	n, err := strconv.ParseInt(lit, 10, strconv.IntSize)
	if err != nil {
		d.mismatch(start, "number "+lit+" is not an int")
		return
	}
	*dst = int(n)
}

func (d *decoder) uintField(dst *uint) {
	lit, start, ok := d.numberLiteral("uint")
	if !ok {
		return
	}
	n, err := strconv.ParseUint(lit, 10, strconv.IntSize)
	if err != nil {
		d.mismatch(start, "number "+lit+" is not an unsigned integer")
		return
	}
	*dst = uint(n)
}

func (d *decoder) uint32Field(dst *uint32) {
	lit, start, ok := d.numberLiteral("uint32")
	if !ok {
		return
	}
	n, err := strconv.ParseUint(lit, 10, 32)
	if err != nil {
		d.mismatch(start, "number "+lit+" is not a uint32")
		return
	}
	*dst = uint32(n)
}

// parseInt parses a decimal integer literal quickly; it reports err for anything but
// -?[0-9]+ that fits an int64 (fractions and exponents included).
func parseInt(lit string) (int64, bool) {
	neg := false
	s := lit
	if len(s) > 0 && s[0] == '-' {
		neg = true
		s = s[1:]
	}
	if len(s) == 0 || len(s) > 18 {
		n, err := strconv.ParseInt(lit, 10, 64)
		return n, err != nil
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, true
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, false
}

// literal consumes the keyword word (true, false, null).
func (d *decoder) literal(word string) bool {
	for k := 0; k < len(word); k++ {
		if d.i >= len(d.s) {
			d.syntaxErr("unexpected end of JSON input")
			return false
		}
		if d.s[d.i] != word[k] {
			d.unexpected("in literal " + word + " (expecting " + quoteChar(word[k]) + ")")
			return false
		}
		d.i++
	}
	return true
}

// number consumes a JSON number and returns its literal.
func (d *decoder) number() (string, bool) {
	start := d.i
	s := d.s
	i := d.i
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i >= len(s):
		d.i = i
		d.syntaxErr("unexpected end of JSON input")
		return "", false
	case s[i] == '0':
		i++
	case '1' <= s[i] && s[i] <= '9':
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
	default:
		d.i = i
		d.unexpected("in numeric literal")
		return "", false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i >= len(s) || s[i] < '0' || s[i] > '9' {
			d.i = i
			d.unexpected("after decimal point in numeric literal")
			return "", false
		}
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i >= len(s) || s[i] < '0' || s[i] > '9' {
			d.i = i
			d.unexpected("in exponent of numeric literal")
			return "", false
		}
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
	}
	d.i = i
	return s[start:i], true
}

// str consumes a JSON string and returns its decoded value. Strings without escapes and with
// valid UTF-8 are returned as substrings of the input (no copy); otherwise they are decoded
// like encoding/json does, replacing invalid UTF-8 and lone surrogates with U+FFFD.
func (d *decoder) str() (string, bool) {
	s := d.s
	start := d.i + 1
	i := start
	for i < len(s) {
		c := s[i]
		switch {
		case c == '"':
			d.i = i + 1
			return s[start:i], true
		case c == '\\':
			return d.strSlow(start)
		case c < 0x20:
			d.i = i
			d.unexpected("in string literal")
			return "", false
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				return d.strSlow(start)
			}
			i += size
		}
	}
	d.i = i
	d.syntaxErr("unexpected end of JSON input")
	return "", false
}

func (d *decoder) strSlow(start int) (string, bool) {
	s := d.s
	var b strings.Builder
	b.Grow(len(s) - start)
	i := start
	for i < len(s) {
		c := s[i]
		switch {
		case c == '"':
			d.i = i + 1
			return b.String(), true
		case c == '\\':
			i++
			if i >= len(s) {
				d.i = i
				d.syntaxErr("unexpected end of JSON input")
				return "", false
			}
			switch s[i] {
			case '"', '\\', '/':
				b.WriteByte(s[i])
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				r, ok := d.hex4(i + 1)
				if !ok {
					return "", false
				}
				i += 4
				if utf16IsSurrogate(r) {
					// A high surrogate followed by an escaped low surrogate is one rune;
					// anything else is a lone surrogate and becomes U+FFFD.
					if r < 0xDC00 && i+2 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
						if r2, ok2 := d.hex4Peek(i + 3); ok2 && 0xDC00 <= r2 && r2 <= 0xDFFF {
							b.WriteRune(((r - 0xD800) << 10) + (r2 - 0xDC00) + 0x10000)
							i += 6
							break
						}
					}
					b.WriteRune(utf8.RuneError)
					break
				}
				b.WriteRune(r)
			default:
				d.i = i
				d.unexpected("in string escape code")
				return "", false
			}
			i++
		case c < 0x20:
			d.i = i
			d.unexpected("in string literal")
			return "", false
		case c < utf8.RuneSelf:
			b.WriteByte(c)
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b.WriteRune(utf8.RuneError)
			} else {
				b.WriteString(s[i : i+size])
			}
			i += size
		}
	}
	d.i = i
	d.syntaxErr("unexpected end of JSON input")
	return "", false
}

func utf16IsSurrogate(r rune) bool { return 0xD800 <= r && r < 0xE000 }

// hex4 reads the four hex digits of a \u escape starting at i, recording a syntax error.
func (d *decoder) hex4(i int) (rune, bool) {
	var r rune
	for k := 0; k < 4; k++ {
		if i+k >= len(d.s) {
			d.i = i + k
			d.syntaxErr("unexpected end of JSON input")
			return 0, false
		}
		v, ok := hexVal(d.s[i+k])
		if !ok {
			d.i = i + k
			d.unexpected("in \\u hexadecimal character escape")
			return 0, false
		}
		r = r<<4 | v
	}
	return r, true
}

// hex4Peek reads four hex digits at i without recording errors; the caller reparses on failure.
func (d *decoder) hex4Peek(i int) (rune, bool) {
	if i+4 > len(d.s) {
		return 0, false
	}
	var r rune
	for k := 0; k < 4; k++ {
		v, ok := hexVal(d.s[i+k])
		if !ok {
			return 0, false
		}
		r = r<<4 | v
	}
	return r, true
}

func hexVal(c byte) (rune, bool) {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0'), true
	case 'a' <= c && c <= 'f':
		return rune(c-'a') + 10, true
	case 'A' <= c && c <= 'F':
		return rune(c-'A') + 10, true
	}
	return 0, false
}

// skipValue consumes any JSON value, validating its syntax, and returns its kind ("object",
// "array", "string", "number", "bool", "null"), or "" after a syntax error.
func (d *decoder) skipValue() string {
	switch c := d.peek(); {
	case c == '{':
		d.object("", func(string) { d.skipValue() })
		if d.failed() {
			return ""
		}
		return "object"
	case c == '[':
		if !d.push() {
			return ""
		}
		d.i++
		d.ws()
		if d.peek() == ']' {
			d.i++
			d.pop()
			return "array"
		}
		for {
			d.ws()
			if d.skipValue() == "" {
				return ""
			}
			d.ws()
			switch d.peek() {
			case ',':
				d.i++
			case ']':
				d.i++
				d.pop()
				return "array"
			default:
				d.unexpected("after array element")
				return ""
			}
		}
	case c == '"':
		if _, ok := d.str(); ok {
			return "string"
		}
		return ""
	case c == '-' || ('0' <= c && c <= '9'):
		if _, ok := d.number(); ok {
			return "number"
		}
		return ""
	case c == 't':
		if d.literal("true") {
			return "bool"
		}
		return ""
	case c == 'f':
		if d.literal("false") {
			return "bool"
		}
		return ""
	case c == 'n':
		if d.literal("null") {
			return "null"
		}
		return ""
	default:
		d.unexpected("looking for beginning of value")
		return ""
	}
}
