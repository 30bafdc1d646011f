package annotation

import (
	"encoding/json"

	"github.com/hamireg/hamireg/internal/hamiwire"
)

// PairScore is one GPU's entry of the topology score annotation hami.io/node-nvidia-score
// ([KeyNVIDIAScore]): the GPU's UUID and its score to each other GPU of the node, by the peer's
// UUID (HAMi's DevicePairScore). A higher score is a better connection: PCIe level (60 for a
// GPU-internal path down to 10 across CPU sockets) plus 100 per NVLink.
type PairScore struct {
	UUID   string
	Scores map[string]int
}

// scoreWire is the device plugin's shape of one element: both keys always written, so a GPU
// without peers writes "score":{}.
type scoreWire struct {
	ID     string         `json:"uuid"`
	Scores map[string]int `json:"score"`
}

// EncodePairScores returns the topology score annotation value HAMi's NVIDIA device plugin
// writes for scores, byte for byte: a compact JSON array in the order given (the plugin's
// device order; writers pass their register annotation's order), each element
// {"uuid":…,"score":{…}} with the score keys sorted, "score":{} for a GPU without peers (a nil
// map too). A nil or empty list encodes to "[]".
func EncodePairScores(scores []PairScore) string {
	out := make([]scoreWire, len(scores))
	for i, s := range scores {
		out[i] = scoreWire{ID: s.UUID, Scores: s.Scores}
		if out[i].Scores == nil {
			out[i].Scores = map[string]int{}
		}
	}
	data, err := json.Marshal(out)
	if err != nil {
		return "" // unreachable: strings and ints only
	}
	return string(data)
}

// DecodePairScores parses a topology score annotation value the way HAMi's scheduler does
// (encoding/json into its DevicePairScore list): keys match case-insensitively, unknown keys
// are ignored, scores must be integers, "null" gives no entries without an error, and a null
// element is an entry without UUID (which matches no device).
//
// A value HAMi cannot decode gives a [*DecodeError] with Key [KeyNVIDIAScore] that wraps
// [ErrMalformed]. HAMi's scheduler then drops the whole node ("failed to decode pair scores"):
// readers in this SDK instead keep the node registered without scores (see package
// schedcache).
func DecodePairScores(value string) ([]PairScore, error) {
	data := []byte(value)
	var wire []hamiwire.PairScore
	if err := json.Unmarshal(data, &wire); err != nil {
		de := jsonError(err, data, -1, nil)
		de.Key = KeyNVIDIAScore
		return nil, de
	}
	if wire == nil {
		return nil, nil
	}
	out := make([]PairScore, len(wire))
	for i, w := range wire {
		out[i] = PairScore{UUID: w.ID, Scores: w.Scores}
	}
	return out, nil
}

// ScoresByDevice attaches scores to devices by UUID as HAMi's scheduler does (GetNodeDevices):
// the result is parallel to devices and holds each device's score map; an entry whose UUID is
// no device's is dropped, a later entry for the same UUID replaces an earlier one, and a device
// without an entry gets nil (every score 0). It returns nil when no entry matches a device.
// The maps are shared with scores.
func ScoresByDevice(devices []Device, scores []PairScore) []map[string]int {
	var out []map[string]int
	for _, s := range scores {
		for i := range devices {
			if devices[i].ID != s.UUID {
				continue
			}
			if out == nil {
				out = make([]map[string]int, len(devices))
			}
			out[i] = s.Scores
		}
	}
	return out
}
