package mig

import "errors"

// Errors of this package, for errors.Is.
var (
	// ErrMalformed: a value is not what HAMi writes (bad JSON, a negative index, an empty
	// UUID or profile, a placement of size 0, a partial runtime identity, a duplicate
	// container/device pair, a "[t-p]" suffix that does not parse).
	ErrMalformed = errors.New("malformed MIG value")
	// ErrInvalidAllowlist: a migProfileAllowlist entry HAMi's config loader rejects.
	ErrInvalidAllowlist = errors.New("invalid MIG profile allowlist")
)
