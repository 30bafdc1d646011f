// Module release prepares, checks and tags a release of every module of this repository
// together, and rehearses it as a user outside the repository (TestRehearsal); see
// docs/release.md. Developed here, never released.
module github.com/hamireg/hamireg/hack/release

go 1.26.0

require golang.org/x/mod v0.42.0
