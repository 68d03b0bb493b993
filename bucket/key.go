package bucket

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
)

// ErrInvalidKey is returned for an empty key, by every backend: it is
// almost always a key function that found nothing to key on.
var ErrInvalidKey = errors.New("bucket: key is empty")

// maxKeyLen is the longest key kept as it is in Redis key names; longer
// ones are hashed, so that names stay bounded.
const maxKeyLen = 512

// keyEscaper escapes what cannot appear between the braces of a Redis key
// name: the braces themselves, and the escape character.
var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// keyTag returns key as it appears between the braces of its Redis key
// names, where it is the whole Cluster hash tag: as it is, if it has at most
// maxKeyLen bytes and no '{', '}' or '%'; else with those escaped as %7B,
// %7D and %25; and a longer key as "%sha256:" and the hex SHA-256 of key.
// Distinct keys get distinct tags, since an escaped key holds '%' only
// before "25", "7B" or "7D"; and a tag is never empty nor holds a brace, so
// every name of a key hashes to the same slot.
func keyTag(key string) string {
	if len(key) > maxKeyLen {
		sum := sha256.Sum256([]byte(key))
		return "%sha256:" + hex.EncodeToString(sum[:])
	}
	if !strings.ContainsAny(key, "{}%") {
		return key
	}
	return keyEscaper.Replace(key)
}
