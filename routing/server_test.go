package routing

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// countingQueue is a Queue server that counts the enqueues it is called
// with: a refused request never gets here.
type countingQueue struct {
	triagev1.UnimplementedQueueServer
	enqueues atomic.Int32
}

func (q *countingQueue) Enqueue(context.Context, *triagev1.EnqueueRequest) (*triagev1.EnqueueResponse, error) {
	q.enqueues.Add(1)
	return &triagev1.EnqueueResponse{}, nil
}

func (q *countingQueue) GetTopicStats(context.Context, *triagev1.GetTopicStatsRequest) (*triagev1.TopicStats, error) {
	return &triagev1.TopicStats{}, nil
}

// countingBody is a request body that counts the bytes read from it.
type countingBody struct {
	r    io.Reader
	read atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (b *countingBody) Close() error { return nil }

type gatewayBed struct {
	q  *countingQueue
	gw http.Handler
}

// setupGateway serves a countingQueue through the gateway with opts; the
// key "Bearer good" authenticates when checkKeys.
func setupGateway(t *testing.T, checkKeys bool, opts ...GatewayOption) *gatewayBed {
	t.Helper()
	b := &gatewayBed{q: &countingQueue{}}
	if checkKeys {
		opts = append(opts, WithAuthenticate(func(r *http.Request) error {
			if r.Header.Get("Authorization") != "Bearer good" {
				return status.Error(codes.Unauthenticated, "unknown API key")
			}
			return nil
		}))
	}
	var err error
	b.gw, err = NewGatewayFor(t.Context(), b.q, nil, nil, opts...)
	require.NoError(t, err)
	return b
}

// do serves one request and returns its status, decoded JSON answer and
// how much of the body was read.
func (b *gatewayBed) do(t *testing.T, method, path, contentType, key string, body io.Reader, length int64) (int, map[string]any, int64) {
	t.Helper()
	cb := &countingBody{r: body}
	req := httptest.NewRequest(method, path, nil)
	req.Body, req.ContentLength = cb, length
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if key != "" {
		req.Header.Set("Authorization", key)
	}
	rec := httptest.NewRecorder()
	b.gw.ServeHTTP(rec, req)
	var out map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), "%d %s", rec.Code, rec.Body)
	return rec.Code, out, cb.read.Load()
}

const enqueuePath = "/v1/namespaces/default/topics/t/items"

// TestGatewayAcceptsOnlyJSONBodies: a POST, PUT or PATCH whose
// Content-Type is not application/json (which a web page may send
// cross-site without a preflight) is answered 415 and reaches no RPC; a
// body-less GET needs none.
func TestGatewayAcceptsOnlyJSONBodies(t *testing.T) {
	t.Parallel()
	b := setupGateway(t, false)
	body := `{"items":[{"payload":"aGk="}]}`
	for _, c := range []struct {
		name, method, contentType string
		want                      int
	}{
		{"text/plain", http.MethodPost, "text/plain", http.StatusUnsupportedMediaType},
		{"text/plain with charset", http.MethodPost, "text/plain; charset=utf-8", http.StatusUnsupportedMediaType},
		{"form", http.MethodPost, "application/x-www-form-urlencoded", http.StatusUnsupportedMediaType},
		{"multipart", http.MethodPost, "multipart/form-data; boundary=x", http.StatusUnsupportedMediaType},
		{"none", http.MethodPost, "", http.StatusUnsupportedMediaType},
		{"json lookalike", http.MethodPost, "application/jsonx", http.StatusUnsupportedMediaType},
		{"PUT text/plain", http.MethodPut, "text/plain", http.StatusUnsupportedMediaType},
		{"PATCH text/plain", http.MethodPatch, "text/plain", http.StatusUnsupportedMediaType},
		{"json", http.MethodPost, "application/json", http.StatusOK},
		{"json with charset", http.MethodPost, "application/json; charset=utf-8", http.StatusOK},
		{"json in capitals", http.MethodPost, "Application/JSON", http.StatusOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := b.q.enqueues.Load()
			code, out, _ := b.do(t, c.method, enqueuePath, c.contentType, "", strings.NewReader(body), int64(len(body)))
			require.Equal(t, c.want, code, "%v", out)
			if c.want == http.StatusOK {
				require.Equal(t, before+1, b.q.enqueues.Load())
				return
			}
			require.Equal(t, before, b.q.enqueues.Load(), "refused, yet the RPC ran")
			require.EqualValues(t, codes.InvalidArgument, out["code"])
			require.Contains(t, out["message"], "Content-Type: application/json")
			require.Equal(t, []any{}, out["details"])
		})
	}
	code, out, _ := b.do(t, http.MethodGet, "/v1/namespaces/default/topics/t/stats", "", "", http.NoBody, 0)
	require.Equal(t, http.StatusOK, code, "%v", out)
}

// TestGatewayRefusesUnknownCallersBodyUnread: with a key check, a body
// over MaxUnauthenticatedBody from a caller without a valid key is
// answered 401 before a byte of it is read, whether its length is
// declared or not (then at most MaxUnauthenticatedBody+1 bytes are
// read); a small one goes on to the guard; a known caller's is read.
func TestGatewayRefusesUnknownCallersBodyUnread(t *testing.T) {
	t.Parallel()
	b := setupGateway(t, true)
	big := bytes.Repeat([]byte(" "), 10<<20)
	for _, c := range []struct {
		name, key string
		length    int64
	}{
		{"no key", "", int64(len(big))},
		{"unknown key", "Bearer forged", int64(len(big))},
		{"no key, length not given", "", -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, read := b.do(t, http.MethodPost, enqueuePath, "application/json", c.key, bytes.NewReader(big), c.length)
			require.Equal(t, http.StatusUnauthorized, code, "%v", out)
			require.EqualValues(t, codes.Unauthenticated, out["code"])
			require.Equal(t, "unknown API key", out["message"])
			if c.length >= 0 {
				require.Zero(t, read, "the body was read before the caller was known")
			} else {
				require.LessOrEqual(t, read, int64(MaxUnauthenticatedBody+1))
			}
		})
	}
	require.Zero(t, b.q.enqueues.Load())

	// A small body is read and passed on (here nothing refuses it).
	body := `{"items":[{"payload":"aGk="}]}`
	code, out, _ := b.do(t, http.MethodPost, enqueuePath, "application/json", "", strings.NewReader(body), -1)
	require.Equal(t, http.StatusOK, code, "%v", out)
	// A known caller's large body is read (spaces: JSON's empty request).
	code, out, read := b.do(t, http.MethodPost, enqueuePath, "application/json", "Bearer good", bytes.NewReader(big), int64(len(big)))
	require.Equal(t, http.StatusOK, code, "%v", out)
	require.EqualValues(t, len(big), read)
}

// TestGatewayBodyLimit: a body over the limit (WithMaxBody) is answered
// 413 unread when its length is declared, and 400 saying so when not.
func TestGatewayBodyLimit(t *testing.T) {
	t.Parallel()
	b := setupGateway(t, false, WithMaxBody(1<<10))
	body := `{"items":[{"payload":"` + strings.Repeat("A", 2<<10) + `"}]}`
	code, out, read := b.do(t, http.MethodPost, enqueuePath, "application/json", "", strings.NewReader(body), int64(len(body)))
	require.Equal(t, http.StatusRequestEntityTooLarge, code, "%v", out)
	require.Contains(t, out["message"], "at most 1024 (1 KiB) allowed")
	require.Zero(t, read)
	code, out, _ = b.do(t, http.MethodPost, enqueuePath, "application/json", "", strings.NewReader(body), -1)
	require.Equal(t, http.StatusBadRequest, code, "%v", out)
	require.Contains(t, out["message"], "over 1024 bytes (1 KiB)")
	require.Zero(t, b.q.enqueues.Load())
}
