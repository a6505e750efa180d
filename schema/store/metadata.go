package store

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// MaxMetadataBytes bounds an item's metadata as stored (the JSON object
// MarshalMetadata writes); the column is sized for it.
const MaxMetadataBytes = 16 << 10

// MarshalMetadata stores metadata as a JSON object of strings, without
// HTML escaping: json.Marshal would store '<', '>' and '&' as six bytes
// each, so a value would grow on every merge. Enqueue, update and nack all
// store through it, so validation measures exactly what is stored.
func MarshalMetadata(m map[string]string) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// MergeMetadata applies patch to a stored JSON object of strings: an empty
// value deletes its key. It returns nil for an empty result, and
// ErrMetadataTooLarge when the result would not fit MaxMetadataBytes
// (validating the patch alone does not bound the merge).
func MergeMetadata(stored []byte, patch map[string]string) ([]byte, error) {
	m := map[string]string{}
	if len(stored) > 0 {
		if err := json.Unmarshal(stored, &m); err != nil {
			return nil, fmt.Errorf("stored metadata is not a JSON object of strings: %w", err)
		}
	}
	if len(patch) == 0 {
		return stored, nil
	}
	for k, v := range patch {
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	if len(m) == 0 {
		return nil, nil
	}
	out, err := MarshalMetadata(m)
	if err != nil {
		return nil, err
	}
	if len(out) > MaxMetadataBytes {
		return nil, fmt.Errorf("%w: merged with the item's metadata it would be %d bytes stored as a JSON object; at most %d allowed (delete keys with empty values to make room)",
			ErrMetadataTooLarge, len(out), MaxMetadataBytes)
	}
	return out, nil
}
