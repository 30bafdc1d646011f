package mig

import (
	"fmt"
	"strconv"
	"strings"
)

// maxLegacyIndex bounds the template and position of a "[t-p]" suffix. HAMi v2.9.0's
// geometries have a handful of templates of at most 8 instances; the bound keeps a hostile
// annotation from overflowing an int (v2.9.0 parses with strconv.Atoi and indexes with the
// result: an out-of-range position panics its scheduler). Callers still check the position
// against the geometry they index.
const maxLegacyIndex = 1 << 16

// ParseLegacyUUID splits a device UUID as HAMi v2.9.0 records a MIG device in
// hami.io/vgpu-devices-allocated: "GPU-<uuid>[<template>-<position>]", the index of the
// template within the GPU's geometry and the instance's position among that template's
// instances. A UUID with no '[' and no ']' is a plain GPU UUID: suffixed is false and gpu is
// uuid. A suffix that does not parse (no closing ']' at the end, not two decimal numbers
// joined by '-', a number above 65536, an empty GPU part) and an empty uuid give an error
// wrapping [ErrMalformed].
func ParseLegacyUUID(uuid string) (gpu string, template, position int, suffixed bool, err error) {
	if uuid == "" {
		return "", 0, 0, false, fmt.Errorf("%w: empty device UUID", ErrMalformed)
	}
	open := strings.IndexByte(uuid, '[')
	if open < 0 {
		if strings.IndexByte(uuid, ']') >= 0 {
			return "", 0, 0, false, fmt.Errorf("%w: device UUID %q has ']' without '['", ErrMalformed, uuid)
		}
		return uuid, 0, 0, false, nil
	}
	gpu, suffix := uuid[:open], uuid[open+1:]
	inner, ok := strings.CutSuffix(suffix, "]")
	if !ok || gpu == "" || strings.ContainsAny(inner, "[]") {
		return "", 0, 0, false, fmt.Errorf("%w: device UUID %q: suffix is not [<template>-<position>]", ErrMalformed, uuid)
	}
	ts, ps, ok := strings.Cut(inner, "-")
	if !ok {
		return "", 0, 0, false, fmt.Errorf("%w: device UUID %q: suffix is not [<template>-<position>]", ErrMalformed, uuid)
	}
	if template, err = legacyIndex(uuid, "template", ts); err != nil {
		return "", 0, 0, false, err
	}
	if position, err = legacyIndex(uuid, "position", ps); err != nil {
		return "", 0, 0, false, err
	}
	return gpu, template, position, true, nil
}

// legacyIndex parses one number of a "[t-p]" suffix: decimal digits only, at most
// maxLegacyIndex.
func legacyIndex(uuid, what, s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%w: device UUID %q: %s %q is not a decimal number", ErrMalformed, uuid, what, s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > maxLegacyIndex {
		return 0, fmt.Errorf("%w: device UUID %q: %s %q above %d", ErrMalformed, uuid, what, s, maxLegacyIndex)
	}
	return n, nil
}

// FormatLegacyUUID returns gpu with HAMi v2.9.0's "[template-position]" suffix, as its
// scheduler writes a MIG device into hami.io/vgpu-devices-allocated.
func FormatLegacyUUID(gpu string, template, position int) string {
	return gpu + "[" + strconv.Itoa(template) + "-" + strconv.Itoa(position) + "]"
}
