package transport

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
)

// HostKey is the default key: the request's scheme and host,
// "https://api.openai.com". Every request to a host shares one bucket.
func HostKey(r *http.Request) string {
	return r.URL.Scheme + "://" + r.URL.Host
}

// CredentialKey keys a request by host and by the API key it carries, so
// that each API key has its own bucket: "https://api.openai.com#" followed
// by the Fingerprint of the credential in the Authorization header (its
// scheme, such as "Bearer", left out), or else in X-Api-Key, Api-Key or
// X-Goog-Api-Key. A request with none of these gets HostKey.
func CredentialKey(r *http.Request) string {
	cred := ""
	if v := r.Header.Get("Authorization"); v != "" {
		cred = v
		if i := strings.IndexByte(v, ' '); i > 0 {
			cred = strings.TrimSpace(v[i+1:])
		}
	} else {
		for _, h := range credentialHeaders {
			if v := r.Header.Get(h); v != "" {
				cred = v
				break
			}
		}
	}
	if cred == "" {
		return HostKey(r)
	}
	return HostKey(r) + "#" + Fingerprint(cred)
}

var credentialHeaders = []string{"X-Api-Key", "Api-Key", "X-Goog-Api-Key"}

// Fingerprint returns the first 12 hex digits of the SHA-256 of secret: a
// name for an API key that can be part of a bucket key, a log line or a
// metric attribute without giving the key away.
func Fingerprint(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:6])
}
