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

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/proto/triage/peer"
	"github.com/triage-queue/triage/shardmap"
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
	if len(a.errs) == 0 {
		return "no errors"
	}
	return errors.Join(a.errs...).Error()
}

func (a *asyncErrs) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.errs)
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
		opts := []nats.Option{nats.UserInfo(user, password), nats.MaxReconnects(0), nats.CustomInboxPrefix(peer.InboxPrefix)}
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
// twice, or a client user that is not one subject token (it names the
// login's inbox prefix), stops the server from starting rather than
// opening it up.
func TestAuthRejectsIncompleteLogins(t *testing.T) {
	t.Parallel()
	for _, a := range []natsserver.Auth{
		{Triage: natsserver.Login{User: "triage"}},
		{Triage: natsserver.Login{User: "triage", Password: "x"}, Clients: []natsserver.Login{{User: "c"}}},
		{Triage: natsserver.Login{User: "triage", Password: "x"}, Clients: []natsserver.Login{{User: "triage", Password: "y"}}},
		{Triage: natsserver.Login{User: "triage", Password: "x"}, Clients: []natsserver.Login{{User: "app.orders", Password: "y"}}},
	} {
		_, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), Auth: &a})
		require.Error(t, err, "%+v", a)
	}
}

// TestAuthInboxes: replies are private to whom they answer. A client login
// is refused subscribing to the default inbox "_INBOX.>" (one subscription
// there would read every reply of every connection that keeps the
// default), to Triage's (peer.InboxPrefix), to another client login's and
// to each Internal subject, and publishing to the first two; a ">" or
// "*.>" subscription is accepted but gets none of Triage's traffic. Under
// its own prefix (ClientInboxPrefix) it does request/reply with another
// client login. A Triage connection made with shardmap.NATSOptions drives
// JetStream and KV (API requests, publish acks, a pull fetch, a watch) and
// answers a core request; one that keeps the default prefix is refused its
// reply subscription.
func TestAuthInboxes(t *testing.T) {
	t.Parallel()
	auth := &natsserver.Auth{
		Triage:  natsserver.Login{User: "triage", Password: "t-secret"},
		Clients: []natsserver.Login{{User: "client", Password: "c-secret"}, {User: "other", Password: "o-secret"}},
	}
	s, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), Auth: auth})
	require.NoError(t, err)
	t.Cleanup(s.Shutdown)
	connect := func(errs *asyncErrs, opts ...nats.Option) *nats.Conn {
		nc, err := nats.Connect(s.ClientURL(), append(opts, nats.MaxReconnects(0), nats.ErrorHandler(errs.handler))...)
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	var cerrs, oerrs, terrs asyncErrs
	cli := connect(&cerrs, nats.UserInfo("client", "c-secret"), nats.CustomInboxPrefix(natsserver.ClientInboxPrefix("client")))
	other := connect(&oerrs, nats.UserInfo("other", "o-secret"), nats.CustomInboxPrefix(natsserver.ClientInboxPrefix("other")))

	refused := append([]string{natsserver.DefaultInbox, "_INBOX.*", "_INBOX.abc", peer.InboxPrefix + ".>",
		natsserver.ClientInboxPrefix("other") + ".>"}, natsserver.Internal...)
	for _, subject := range refused {
		_, err := cli.SubscribeSync(subject)
		require.NoError(t, err, subject) // refused asynchronously
		require.NoError(t, cli.Flush())
		require.Eventually(t, func() bool { return cerrs.has(`Permissions Violation for Subscription to "` + subject + `"`) },
			5*time.Second, 10*time.Millisecond, "a client login subscribed to %s: %v", subject, &cerrs)
	}
	for _, subject := range []string{"_INBOX.abc", peer.InboxPrefix + ".abc"} {
		require.NoError(t, cli.Publish(subject, []byte("forged reply")))
		require.NoError(t, cli.Flush())
		require.Eventually(t, func() bool { return cerrs.has(`Permissions Violation for Publish to "` + subject + `"`) },
			5*time.Second, 10*time.Millisecond, "a client login published to %s: %v", subject, &cerrs)
	}
	var (
		mu   sync.Mutex
		seen []string
	)
	for _, wildcard := range []string{">", "*.>"} {
		_, err = cli.Subscribe(wildcard, func(m *nats.Msg) {
			mu.Lock()
			seen = append(seen, m.Subject)
			mu.Unlock()
		})
		require.NoError(t, err)
	}
	require.NoError(t, cli.Flush())

	// Two client logins do request/reply, each under its own prefix.
	_, err = other.Subscribe("billing.rpc", func(m *nats.Msg) { _ = m.Respond(append([]byte("re: "), m.Data...)) })
	require.NoError(t, err)
	require.NoError(t, other.Flush())
	reply, err := cli.Request("billing.rpc", []byte("invoice"), 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "re: invoice", string(reply.Data))
	_, err = other.Subscribe("billing.back", func(m *nats.Msg) { _ = m.Respond([]byte("ok")) })
	require.NoError(t, err)
	require.NoError(t, other.Flush())
	_, err = other.Request("billing.back", nil, 5*time.Second)
	require.NoError(t, err, "the other login's own prefix")

	// Triage's traffic, under peer.InboxPrefix.
	login := &shardmap.NATSLogin{User: "triage", Password: "t-secret"}
	opts, err := shardmap.NATSOptions(login, nil)
	require.NoError(t, err)
	tri := connect(&terrs, opts...)
	_, err = tri.Subscribe("triage.dq.node-1", func(m *nats.Msg) { _ = m.Respond([]byte("leased: payload, token")) })
	require.NoError(t, err)
	require.NoError(t, tri.Flush())
	reply, err = tri.Request("triage.dq.node-1", []byte("dequeue"), 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "leased: payload, token", string(reply.Data))
	require.True(t, strings.HasPrefix(reply.Subject, peer.InboxPrefix+"."), reply.Subject)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, err := jetstream.New(tri)
	require.NoError(t, err)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "triage_owners"})
	require.NoError(t, err)
	w, err := kv.Watch(ctx, "shard.*")
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	_, err = kv.Put(ctx, "shard.1", []byte("node-1"))
	require.NoError(t, err)
	e, err := kv.Get(ctx, "shard.1")
	require.NoError(t, err)
	require.Equal(t, "node-1", string(e.Value()))
	for e := range w.Updates() {
		if e != nil { // nil marks the end of the initial values
			require.Equal(t, "shard.1", e.Key())
			break
		}
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TRIAGE_ENQ_US_EAST", Subjects: []string{"triage.enq.us-east.*"}})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "triage.enq.us-east.1", []byte("tenant payload"))
	require.NoError(t, err)
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "enqueuer", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	var got []string
	for m := range batch.Messages() {
		got = append(got, string(m.Data()))
		require.NoError(t, m.DoubleAck(ctx))
	}
	require.NoError(t, batch.Error())
	require.Equal(t, []string{"tenant payload"}, got)
	require.NoError(t, tri.Flush())
	require.Zero(t, terrs.len(), "the Triage login was refused: %v", &terrs)

	// Nothing of it reached the client's ">" but the billing exchange.
	require.NoError(t, cli.Flush())
	mu.Lock()
	require.NotEmpty(t, seen, "the client's \">\" gets nothing at all")
	for _, subject := range seen {
		require.True(t, strings.HasPrefix(subject, "billing.") || strings.HasPrefix(subject, natsserver.ClientInboxPrefix("client")+"."),
			"the client login received %s", subject)
	}
	mu.Unlock()

	// A Triage process that keeps the default prefix fails loudly.
	var derrs asyncErrs
	plain := connect(&derrs, nats.UserInfo("triage", "t-secret"))
	_, err = plain.Request("$JS.API.INFO", nil, time.Second)
	require.Error(t, err)
	require.True(t, derrs.has(`Permissions Violation for Subscription to "_INBOX.`), "%v", &derrs)
}
