package extender

import (
	"bytes"
	"encoding/json"
	"fmt"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
)

// podDocument is the admitted pod as generic JSON: the webhook edits it and answers the
// difference from the object it was sent (jsonpatch.CreatePatch), so that the patch applies to
// exactly that object, whichever of its fields are absent or null. Numbers stay json.Number,
// so nothing the webhook does not change differs.
type podDocument map[string]any

func decodePodDocument(raw []byte) (podDocument, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var doc podDocument
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("decode pod: %w", err)
	}
	return doc, nil
}

// object returns m[key] as an object, creating it when absent or null.
func object(m map[string]any, key string) (map[string]any, error) {
	switch v := m[key].(type) {
	case map[string]any:
		return v, nil
	case nil:
		o := map[string]any{}
		m[key] = o
		return o, nil
	default:
		return nil, fmt.Errorf("%s is a %T, not an object", key, v)
	}
}

// container returns spec.containers[i].
func (d podDocument) container(i int) (map[string]any, error) {
	spec, err := object(d, "spec")
	if err != nil {
		return nil, err
	}
	list, _ := spec["containers"].([]any)
	if i >= len(list) {
		return nil, fmt.Errorf("no container %d", i)
	}
	c, ok := list[i].(map[string]any)
	if !ok {
		if list[i] != nil {
			return nil, fmt.Errorf("container %d is a %T, not an object", i, list[i])
		}
		c = map[string]any{}
		list[i] = c
	}
	return c, nil
}

// mutateContainer adds limits to container i's resources.limits and appends env to its env.
func (d podDocument) mutateContainer(i int, limits corev1.ResourceList, env []corev1.EnvVar) error {
	if len(limits) == 0 && len(env) == 0 {
		return nil
	}
	c, err := d.container(i)
	if err != nil {
		return err
	}
	if len(limits) > 0 {
		res, err := object(c, "resources")
		if err != nil {
			return err
		}
		l, err := object(res, "limits")
		if err != nil {
			return err
		}
		for name, q := range limits {
			l[string(name)] = q.String()
		}
	}
	if len(env) > 0 {
		list, ok := c["env"].([]any)
		if !ok && c["env"] != nil {
			return fmt.Errorf("env is a %T, not a list", c["env"])
		}
		for _, v := range env {
			item := map[string]any{"name": v.Name, "value": v.Value}
			list = append(list, item)
		}
		c["env"] = list
	}
	return nil
}

// setSchedulerName sets spec.schedulerName.
func (d podDocument) setSchedulerName(name string) error {
	spec, err := object(d, "spec")
	if err != nil {
		return err
	}
	spec["schedulerName"] = name
	return nil
}

// patch returns the JSON patch from original to d; nil when they do not differ.
func (d podDocument) patch(original []byte) ([]byte, error) {
	modified, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode pod: %w", err)
	}
	ops, err := jsonpatch.CreatePatch(original, modified)
	if err != nil {
		return nil, fmt.Errorf("create patch: %w", err)
	}
	if len(ops) == 0 {
		return nil, nil
	}
	return json.Marshal(ops)
}
