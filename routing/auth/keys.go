package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Role is what a key may do on a namespace.
type Role string

// The roles. See the package documentation for the RPCs of each.
const (
	Producer     Role = "producer"
	Consumer     Role = "consumer"
	Reader       Role = "reader"
	Admin        Role = "admin"
	ClusterAdmin Role = "cluster-admin"
	// public marks RPCs anyone may call (health, reflection).
	public Role = ""
)

// namespaceRoles are the roles a keys file may grant per namespace.
var namespaceRoles = []Role{Producer, Consumer, Reader, Admin}

// AllNamespaces in a grant means every namespace, present and future.
const AllNamespaces = "*"

// TokenPrefix starts every key NewToken makes, so a leaked key is easy to
// recognize (secret scanners) and a value that is not a key (a password,
// a JWT) is refused before any lookup.
const TokenPrefix = "trk_"

// tokenBytes is the randomness of a key: 256 bits, so a fast hash (one
// SHA-256) stores it safely.
const tokenBytes = 32

// maxTokenLen bounds what is hashed per request.
const maxTokenLen = 256

// Key is one identity of the keys file.
type Key struct {
	// Name identifies the caller in logs and audit lines. Required,
	// unique.
	Name string `json:"name"`
	// SHA256 is the hex SHA-256 of the key (HashToken), never the key.
	// Optional when ClientCerts is set.
	SHA256 string `json:"sha256,omitempty"`
	// ClientCerts are certificate names (common name, or a DNS, URI or
	// e-mail SAN) that authenticate as this identity over mTLS.
	ClientCerts []string `json:"client_certs,omitempty"`
	// Namespaces grants roles per namespace; "*" is every namespace.
	Namespaces map[string][]Role `json:"namespaces,omitempty"`
	// ClusterAdmin grants cluster-admin, which holds every role on every
	// namespace too.
	ClusterAdmin bool `json:"cluster_admin,omitempty"`
	// RateLimit is the most requests per second this identity may make
	// (a token bucket); 0 means no limit.
	RateLimit float64 `json:"rate_limit,omitempty"`
	// Burst is the bucket's size. Default: RateLimit rounded up, at least 1.
	Burst int `json:"burst,omitempty"`
}

// File is the keys file: {"keys": [...]}.
type File struct {
	Keys []Key `json:"keys"`
}

// KeySet is a parsed keys file, indexed for lookups.
type KeySet struct {
	byHash map[[sha256.Size]byte]*Key
	byCert map[string]*Key
}

// ParseKeys parses and checks a keys file. Every mistake is reported with
// the entry it is in.
func ParseKeys(data []byte) (*KeySet, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("keys file is not valid JSON of the form {\"keys\": [{\"name\": ..., \"sha256\": ..., \"namespaces\": {...}}]}: %w", err)
	}
	if dec.More() {
		return nil, errors.New("keys file: extra data after the JSON object")
	}
	s := &KeySet{byHash: map[[sha256.Size]byte]*Key{}, byCert: map[string]*Key{}}
	names := map[string]bool{}
	for i := range f.Keys {
		k := &f.Keys[i]
		where := fmt.Sprintf("keys file: keys[%d]", i)
		if k.Name == "" {
			return nil, fmt.Errorf("%s: name is required", where)
		}
		where += fmt.Sprintf(" (%q)", k.Name)
		if names[k.Name] {
			return nil, fmt.Errorf("%s: name used twice", where)
		}
		names[k.Name] = true
		if k.SHA256 == "" && len(k.ClientCerts) == 0 {
			return nil, fmt.Errorf("%s: give sha256 (of the key) or client_certs, else nobody can authenticate as it", where)
		}
		if k.SHA256 != "" {
			raw, err := hex.DecodeString(k.SHA256)
			if err != nil || len(raw) != sha256.Size {
				return nil, fmt.Errorf("%s: sha256 must be 64 hex digits (the SHA-256 of the key, as triage key create prints it), not the key itself", where)
			}
			h := [sha256.Size]byte(raw)
			if other, dup := s.byHash[h]; dup {
				return nil, fmt.Errorf("%s: same key hash as %q", where, other.Name)
			}
			s.byHash[h] = k
		}
		for _, c := range k.ClientCerts {
			if c == "" {
				return nil, fmt.Errorf("%s: empty client_certs name", where)
			}
			if other, dup := s.byCert[c]; dup {
				return nil, fmt.Errorf("%s: client certificate name %q is also %q's", where, c, other.Name)
			}
			s.byCert[c] = k
		}
		for ns, roles := range k.Namespaces {
			if ns == "" {
				return nil, fmt.Errorf("%s: empty namespace name (use \"*\" for every namespace)", where)
			}
			for _, r := range roles {
				if !slices.Contains(namespaceRoles, r) {
					return nil, fmt.Errorf("%s: namespaces[%q]: role %q: allowed producer, consumer, reader, admin (cluster-admin is \"cluster_admin\": true)", where, ns, r)
				}
			}
		}
		if k.RateLimit < 0 || k.Burst < 0 {
			return nil, fmt.Errorf("%s: rate_limit and burst must not be negative", where)
		}
	}
	return s, nil
}

// byToken returns the key whose hash is token's.
func (s *KeySet) byToken(token string) (*Key, bool) {
	k, ok := s.byHash[sha256.Sum256([]byte(token))]
	return k, ok
}

// allows reports whether k holds role on namespace ns.
func (k *Key) allows(role Role, ns string) bool {
	if k.ClusterAdmin {
		return true
	}
	if role == ClusterAdmin {
		return false
	}
	return slices.Contains(k.Namespaces[ns], role) || slices.Contains(k.Namespaces[AllNamespaces], role)
}

// NewToken returns a new random key and its hash for the keys file.
func NewToken() (token, hash string, err error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	token = TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	return token, HashToken(token), nil
}

// HashToken is what the keys file stores of token: hex SHA-256.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// ParseToken checks that s has the form of a key (NewToken's), so that
// anything else is refused with a clear message before any lookup.
func ParseToken(s string) (string, error) {
	if !strings.HasPrefix(s, TokenPrefix) {
		return "", fmt.Errorf("API key must start with %q", TokenPrefix)
	}
	if len(s) > maxTokenLen {
		return "", fmt.Errorf("API key is %d bytes; at most %d", len(s), maxTokenLen)
	}
	body := s[len(TokenPrefix):]
	if len(body) < 16 {
		return "", errors.New("API key is too short")
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return "", fmt.Errorf("API key has a character outside base64url at byte %d", len(TokenPrefix)+i)
		}
	}
	return s, nil
}

// ParseAuthorization returns the key of an "authorization" header value
// "Bearer <key>" (scheme case-insensitive, as RFC 9110 says).
func ParseAuthorization(h string) (string, error) {
	scheme, rest, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", errors.New(`authorization must be "Bearer <key>"`)
	}
	return ParseToken(strings.TrimLeft(rest, " "))
}

// Keys is a keys file that is re-read when it changes.
type Keys struct {
	path string
	log  *slog.Logger
	// every is the least time between two checks of the file.
	every time.Duration

	mu      sync.Mutex
	cur     *KeySet
	sum     [sha256.Size]byte // of the file last read
	checked time.Time
}

// LoadKeys reads the keys file at path; an error says what is wrong with
// it. Later changes are picked up by Current.
func LoadKeys(path string, log *slog.Logger) (*Keys, error) {
	k := &Keys{path: path, log: log, every: time.Second}
	if err := k.reload(time.Now()); err != nil {
		return nil, err
	}
	return k, nil
}

// reload re-parses the file if its content changed (compared whole: a
// same-size edit within one mtime tick is still seen). k.mu is held or k
// is not shared yet.
func (k *Keys) reload(now time.Time) error {
	k.checked = now
	data, err := os.ReadFile(k.path)
	if err != nil {
		return fmt.Errorf("keys file: %w", err)
	}
	sum := sha256.Sum256(data)
	if sum == k.sum {
		return nil
	}
	// Remembered even when the file is bad, so a bad version is reported
	// once, not every second.
	k.sum = sum
	s, err := ParseKeys(data)
	if err != nil {
		return fmt.Errorf("%s: %w", k.path, err)
	}
	k.cur = s
	return nil
}

// Current returns the keys in force, re-reading the file first when it
// changed (checked at most once per second). A file that became unreadable
// or invalid keeps the last good keys, and says why in the log.
func (k *Keys) Current() *KeySet {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := time.Now()
	if now.Sub(k.checked) >= k.every {
		if err := k.reload(now); err != nil && k.log != nil {
			k.log.Error("keys file not reloaded; keeping the last good keys", "err", err)
		}
	}
	return k.cur
}
