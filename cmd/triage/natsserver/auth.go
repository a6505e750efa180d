package natsserver

import (
	"errors"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/triage-queue/triage/proto/triage/peer"
)

// Auth makes a server require a user and password of every client, and
// decides what each may do. Without it anyone who reaches the port may
// publish raw envelopes on Triage's internal subjects, skipping the
// router's validation, quotas and authorization.
type Auth struct {
	// Triage is the login of Triage's own processes (nodes, bootstrap,
	// beds): TriagePermissions.
	Triage Login
	// Clients are everyone else's logins (tools, dashboards, a bridge):
	// ClientPermissions, so none may publish or subscribe on the internal
	// subjects or drive JetStream and its KV buckets, and each receives
	// replies under its own ClientInboxPrefix. A client user is therefore
	// one subject token.
	Clients []Login
}

// Login is a user name and its password.
type Login struct {
	User     string `json:"user"`
	Password string `json:"password"`
}

// Internal are the subjects only Triage may use: its own (enqueue
// streams, dequeue requests, ready notices, commits, health, failover),
// the replies its processes receive (peer.InboxPrefix: dequeue answers
// carry payloads and lease tokens, JetStream's carry stream contents),
// JetStream's API, acks and flow control, the KV buckets' subjects (the
// shard map, ownership and health live there), and the server's system
// subjects.
var Internal = []string{"triage.>", peer.InboxPrefix + ".>", "$JS.>", "$KV.>", "$SYS.>"}

// DefaultInbox is the reply subjects of a nats.go connection that sets no
// inbox prefix. Client logins may neither publish nor subscribe there: one
// subscription to it would receive every reply to every other connection
// that uses it, so each client login has its own (ClientInboxPrefix).
const DefaultInbox = "_INBOX.>"

// ClientInboxPrefix is the reply prefix of client login user, which its
// applications set with nats.CustomInboxPrefix: the login may subscribe
// under it, no other client login may.
func ClientInboxPrefix(user string) string { return "_INBOX_" + user }

// TriagePermissions lets Triage's processes use its subjects, their
// replies (peer.InboxPrefix), JetStream and KV, and nothing else: a leaked
// Triage password still cannot reach other tenants of a shared server's
// account. A Triage process that replies under "_INBOX." (a connection
// made without shardmap.NATSOptions) is refused its reply subscriptions.
func TriagePermissions() *server.Permissions {
	allow := []string{"triage.>", peer.InboxPrefix + ".>", "$JS.>", "$KV.>"}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: allow},
		Subscribe: &server.SubjectPermission{Allow: allow},
	}
}

// ClientPermissions are those of client login user, where others are the
// server's client logins (user among them is skipped). They forbid publishing and subscribing on
// Internal, since a client reaches Triage through the router's API, whose
// authorization (routing/auth) NATS cannot apply, and on DefaultInbox; and
// subscribing under the other logins' ClientInboxPrefix, so one client
// cannot read another's replies. A subscription whose wildcard covers a
// denied subject (">") is accepted, and the server drops the denied
// subjects' messages before they reach it.
func ClientPermissions(user string, others ...string) *server.Permissions {
	deny := append(slices.Clip(Internal), DefaultInbox)
	sub := slices.Clip(deny)
	for _, o := range others {
		if o != user {
			sub = append(sub, ClientInboxPrefix(o)+".>")
		}
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Deny: deny},
		Subscribe: &server.SubjectPermission{Deny: sub},
	}
}

// users is a's logins as server users.
func (a *Auth) users() ([]*server.User, error) {
	if a.Triage.User == "" || a.Triage.Password == "" {
		return nil, errors.New("natsserver: auth: the Triage login needs a user and a password")
	}
	out := []*server.User{{Username: a.Triage.User, Password: a.Triage.Password, Permissions: TriagePermissions()}}
	seen := map[string]bool{a.Triage.User: true}
	var clients []string
	for _, c := range a.Clients {
		if c.User == "" || c.Password == "" {
			return nil, errors.New("natsserver: auth: a client login needs a user and a password")
		}
		if seen[c.User] {
			return nil, errors.New("natsserver: auth: user " + c.User + " is given twice")
		}
		if !subjectToken(c.User) {
			return nil, errors.New("natsserver: auth: client user " + c.User + " names its inbox prefix (" +
				ClientInboxPrefix(c.User) + "), so it cannot contain '.', '*', '>' or white space")
		}
		seen[c.User] = true
		clients = append(clients, c.User)
	}
	for _, c := range a.Clients {
		out = append(out, &server.User{Username: c.User, Password: c.Password, Permissions: ClientPermissions(c.User, clients...)})
	}
	return out, nil
}

// subjectToken reports whether s is one literal token of a subject.
func subjectToken(s string) bool {
	return s != "" && !strings.ContainsAny(s, ".*> \t\r\n")
}
