package natsserver_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/natsserver"
)

// asyncErrs collects a connection's asynchronous errors (permission
// violations arrive so).
type asyncErrs struct {
	mu   sync.Mutex
	errs []error
}

func (a *asyncErrs) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	a.errs = append(a.errs, err)
	a.mu.Unlock()
}

func (a *asyncErrs) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return errors.Join(a.errs...).Error()
}

func (a *asyncErrs) has(substr string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.errs {
		if strings.Contains(e.Error(), substr) {
			return true
		}
	}
	return false
}

// TestAuth: without a login nobody connects; a client login is refused
// publishing and subscribing on internal subjects and JetStream, but may
// use other subjects; the Triage login uses the internal subjects,
// JetStream and KV.
func TestAuth(t *testing.T) {
	t.Parallel()
	auth := &natsserver.Auth{
		Triage:  natsserver.Login{User: "triage", Password: "t-secret"},
		Clients: []natsserver.Login{{User: "client", Password: "c-secret"}},
	}
	s, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), Auth: auth})
	require.NoError(t, err)
	t.Cleanup(s.Shutdown)
	connect := func(user, password string, errs *asyncErrs) (*nats.Conn, error) {
		opts := []nats.Option{nats.UserInfo(user, password), nats.MaxReconnects(0)}
		if errs != nil {
			opts = append(opts, nats.ErrorHandler(errs.handler))
		}
		nc, err := nats.Connect(s.ClientURL(), opts...)
		if err == nil {
			t.Cleanup(nc.Close)
		}
		return nc, err
	}
	for _, login := range [][2]string{{"", ""}, {"client", "wrong"}, {"triage", "c-secret"}, {"nobody", "t-secret"}} {
		_, err := connect(login[0], login[1], nil)
		require.ErrorIs(t, err, nats.ErrAuthorization, "%q", login[0])
	}

	tri, err := connect("triage", "t-secret", nil)
	require.NoError(t, err)
	internal := make(chan *nats.Msg, 4)
	_, err = tri.ChanSubscribe("triage.>", internal)
	require.NoError(t, err)
	require.NoError(t, tri.Flush())

	var cerrs asyncErrs
	cli, err := connect("client", "c-secret", &cerrs)
	require.NoError(t, err)
	require.NoError(t, cli.Publish("triage.enq.us-east.1", []byte("raw envelope")))
	require.NoError(t, cli.Flush())
	require.Eventually(t, func() bool { return cerrs.has(`Permissions Violation for Publish to "triage.enq.us-east.1"`) }, 5*time.Second, 10*time.Millisecond, "%v", &cerrs)
	_, err = cli.SubscribeSync("triage.dq.>")
	require.NoError(t, err) // refused asynchronously
	require.NoError(t, cli.Flush())
	require.Eventually(t, func() bool { return cerrs.has(`Permissions Violation for Subscription to "triage.dq.>"`) }, 5*time.Second, 10*time.Millisecond, "%v", &cerrs)
	js, err := jetstream.New(cli)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = js.CreateKeyValue(short, jetstream.KeyValueConfig{Bucket: "triage_shardmap"})
	require.Error(t, err, "a client cannot drive JetStream (the shard map lives in KV)")
	// Other subjects are the client's.
	other := make(chan *nats.Msg, 1)
	_, err = cli.ChanSubscribe("billing.events", other)
	require.NoError(t, err)
	require.NoError(t, cli.Publish("billing.events", []byte("hi")))
	select {
	case m := <-other:
		require.Equal(t, "hi", string(m.Data))
	case <-time.After(5 * time.Second):
		t.Fatal("a client's own subject is not delivered")
	}

	// The Triage login works, and nothing of the client reached it.
	require.NoError(t, tri.Publish("triage.ready.default", []byte("notice")))
	select {
	case m := <-internal:
		require.Equal(t, "triage.ready.default", m.Subject, "the client's envelope was delivered")
	case <-time.After(5 * time.Second):
		t.Fatal("the Triage login's publish is not delivered")
	}
	ctx, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	tjs, err := jetstream.New(tri)
	require.NoError(t, err)
	kv, err := tjs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "triage_shardmap"})
	require.NoError(t, err)
	_, err = kv.Put(ctx, "map", []byte("v1"))
	require.NoError(t, err)
	e, err := kv.Get(ctx, "map")
	require.NoError(t, err)
	require.Equal(t, "v1", string(e.Value()))
	_, err = tjs.CreateStream(ctx, jetstream.StreamConfig{Name: "TRIAGE_ENQ_US_EAST", Subjects: []string{"triage.enq.us-east.*"}})
	require.NoError(t, err)
	_, err = tjs.Publish(ctx, "triage.enq.us-east.1", []byte("batch"))
	require.NoError(t, err)
	// The client still cannot read the bucket the Triage login wrote.
	short2, cancel3 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel3()
	ckv, err := js.KeyValue(short2, "triage_shardmap")
	if err == nil {
		_, err = ckv.Get(short2, "map")
	}
	require.Error(t, err)
	require.False(t, errors.Is(err, jetstream.ErrKeyNotFound), "%v", err)
}

// TestAuthRejectsIncompleteLogins: a login without a password or given
// twice stops the server from starting rather than opening it up.
func TestAuthRejectsIncompleteLogins(t *testing.T) {
	t.Parallel()
	for _, a := range []natsserver.Auth{
		{Triage: natsserver.Login{User: "triage"}},
		{Triage: natsserver.Login{User: "triage", Password: "x"}, Clients: []natsserver.Login{{User: "c"}}},
		{Triage: natsserver.Login{User: "triage", Password: "x"}, Clients: []natsserver.Login{{User: "triage", Password: "y"}}},
	} {
		_, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), Auth: &a})
		require.Error(t, err, "%+v", a)
	}
}
