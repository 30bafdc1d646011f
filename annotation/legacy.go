package annotation

import (
	"fmt"
	"strconv"
	"strings"
)

// DecodeLegacy parses the pre-JSON colon/comma register format that HAMi still reads for Hygon
// DCU and Iluvatar: each device is "id,count,devmem,devcore,type,numa,health[,index,mode]"
// followed by ':'. The 7-field form has index 0 and mode "hami-core". It applies HAMi master's
// strict rules (every field must parse; v2.9.0 silently zeroed bad numbers) and returns nil with
// a [*DecodeError] wrapping [ErrMalformed] on any failure. A value without any ':' is rejected;
// ":" alone decodes to no devices.
func DecodeLegacy(value string) ([]Device, error) {
	devs, err := decodeLegacy(value)
	if err != nil {
		return nil, err
	}
	return devs, nil
}

func decodeLegacy(value string) ([]Device, *DecodeError) {
	fail := func(offset int, msg string) *DecodeError {
		return &DecodeError{Kind: ErrMalformed, Offset: offset, Element: -1, Msg: msg}
	}
	if !strings.Contains(value, ":") {
		return nil, fail(-1, "node annotation missing device separator")
	}
	var out []Device
	offset := 0
	for seg := range strings.SplitSeq(value, ":") {
		segStart := offset
		offset += len(seg) + 1
		if seg == "" {
			continue
		}
		if !strings.Contains(seg, ",") {
			return nil, fail(segStart, fmt.Sprintf("malformed node annotation segment: %q", seg))
		}
		f := strings.Split(seg, ",")
		if len(f) != 7 && len(f) != 9 {
			return nil, fail(segStart, fmt.Sprintf("unexpected field count %d in node annotation", len(f)))
		}
		count, err := strconv.ParseInt(f[1], 10, 32)
		if err != nil {
			return nil, fail(segStart, "invalid count field: "+err.Error())
		}
		devmem, err := strconv.ParseInt(f[2], 10, 32)
		if err != nil {
			return nil, fail(segStart, "invalid memory field: "+err.Error())
		}
		devcore, err := strconv.ParseInt(f[3], 10, 32)
		if err != nil {
			return nil, fail(segStart, "invalid core field: "+err.Error())
		}
		health, err := strconv.ParseBool(f[6])
		if err != nil {
			return nil, fail(segStart, "invalid health field: "+err.Error())
		}
		numa, err := strconv.Atoi(f[5])
		if err != nil {
			return nil, fail(segStart, "invalid numa field: "+err.Error())
		}
		dev := Device{ID: f[0], Count: int32(count), Devmem: int32(devmem), Devcore: int32(devcore),
			Type: f[4], Numa: numa, Health: health, Mode: "hami-core"}
		if len(f) == 9 {
			index, err := strconv.Atoi(f[7])
			if err != nil {
				return nil, fail(segStart, "invalid index field: "+err.Error())
			}
			if index < 0 {
				return nil, fail(segStart, fmt.Sprintf("index field must not be negative: %d", index))
			}
			dev.Index = uint(index)
			dev.Mode = f[8]
		}
		out = append(out, dev)
	}
	return out, nil
}

// EncodeLegacy writes devices in the legacy colon/comma format, exactly as HAMi's
// EncodeNodeDevices does (9 fields per device, each followed by ':'). The format has no
// escaping: an ID or type containing ',' or ':' cannot be read back. Index is written as a
// signed integer, as HAMi does.
func EncodeLegacy(devices []Device) string {
	var b strings.Builder
	for _, d := range devices {
		b.WriteString(d.ID)
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(int64(d.Count), 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(int64(d.Devmem), 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(int64(d.Devcore), 10))
		b.WriteByte(',')
		b.WriteString(d.Type)
		b.WriteByte(',')
		b.WriteString(strconv.Itoa(d.Numa))
		b.WriteByte(',')
		b.WriteString(strconv.FormatBool(d.Health))
		b.WriteByte(',')
		b.WriteString(strconv.Itoa(int(d.Index))) // HAMi writes the index as a signed int
		b.WriteByte(',')
		b.WriteString(d.Mode)
		b.WriteByte(':')
	}
	return b.String()
}
