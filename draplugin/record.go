package draplugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// CDIRecordAnnotation is the annotation of a claim's transient CDI spec that holds what
// Prepare did for the claim (the driver, the claim's UID, namespace and name, the devices and
// their answers, the state folder): the same record as the checkpoint's, so that the specs
// alone are enough to rebuild a lost or corrupted checkpoint and to adopt a spec whose
// checkpoint entry a crash prevented.
const CDIRecordAnnotation = CDIVendor + "/prepared"

// specRecord is the value of [CDIRecordAnnotation].
type specRecord struct {
	Driver string        `json:"driver"`
	UID    types.UID     `json:"uid"`
	Claim  preparedClaim `json:"claim"`
}

// encodeSpecRecord is the annotation value of claim uid prepared by driver.
func encodeSpecRecord(driver string, uid types.UID, c preparedClaim) (string, error) {
	data, err := json.Marshal(specRecord{Driver: driver, UID: uid, Claim: c})
	if err != nil {
		return "", err
	}
	return string(data), nil
}

// decodeSpecRecord parses the annotation value of the CDI spec at path and checks it as the
// checkpoint's claims are checked, and that it names path as its spec.
func decodeSpecRecord(path, value string) (specRecord, error) {
	var r specRecord
	dec := json.NewDecoder(strings.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return specRecord{}, fmt.Errorf("decode %s: %w", CDIRecordAnnotation, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return specRecord{}, fmt.Errorf("decode %s: data after the record", CDIRecordAnnotation)
	}
	if r.Driver == "" {
		return specRecord{}, fmt.Errorf("%s: no driver", CDIRecordAnnotation)
	}
	if err := checkClaim(r.UID, r.Claim); err != nil {
		return specRecord{}, fmt.Errorf("%s: claim %q: %w", CDIRecordAnnotation, r.UID, err)
	}
	if r.Claim.CDISpec != path {
		return specRecord{}, fmt.Errorf("%s: names the spec %s, but is in %s", CDIRecordAnnotation, r.Claim.CDISpec, path)
	}
	return r, nil
}

// readSpecRecord reads the record of the CDI spec file path. ok is false, with no error, for
// a spec without the annotation (written before the annotation existed, or by hand).
func readSpecRecord(path string) (r specRecord, ok bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return specRecord{}, false, err
	}
	var spec cdispec.Spec
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&spec); err != nil {
		return specRecord{}, false, fmt.Errorf("decode CDI spec: %w", err)
	}
	v, ok := spec.Annotations[CDIRecordAnnotation]
	if !ok {
		return specRecord{}, false, nil
	}
	r, err = decodeSpecRecord(path, v)
	if err != nil {
		return specRecord{}, false, err
	}
	return r, true, nil
}

// specRecords reads the records of driver's claim specs in dir (the files named
// cdiSpecFile(uid)); specs of other drivers, without a record or unreadable are skipped and
// counted in skipped with the reason.
func specRecords(dir, driver string) (records map[types.UID]preparedClaim, skipped map[string]string, err error) {
	records, skipped = map[types.UID]preparedClaim{}, map[string]string{}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return records, skipped, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w folder %s: %w", ErrCDI, dir, err)
	}
	prefix := CDIVendor + "-" + CDIClass + "_"
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, ".json") {
			continue
		}
		path := filepath.Join(dir, name)
		r, ok, err := readSpecRecord(path)
		switch {
		case err != nil:
			skipped[path] = err.Error()
		case !ok:
			skipped[path] = "no " + CDIRecordAnnotation + " annotation"
		case r.Driver != driver:
			// Another driver (the other profile) shares the CDI folder: not ours.
		case filepath.Base(path) != cdiSpecFile(r.UID):
			skipped[path] = fmt.Sprintf("its record is of claim %s", r.UID)
		default:
			records[r.UID] = r.Claim
		}
	}
	return records, skipped, nil
}

// annotateSpec puts the record of claim uid into spec's annotations and sets the CDI
// version that annotations need.
func (p *Plugin) annotateSpec(spec *cdispec.Spec, uid types.UID, c preparedClaim) error {
	v, err := encodeSpecRecord(p.opts.Profile.Driver, uid, c)
	if err != nil {
		return err
	}
	spec.Annotations = map[string]string{CDIRecordAnnotation: v}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return err
	}
	spec.Version = version
	return nil
}
