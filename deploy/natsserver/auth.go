package natsserver

import (
	"errors"

	"github.com/nats-io/nats-server/v2/server"
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
	// subjects or drive JetStream and its KV buckets.
	Clients []Login
}

// Login is a user name and its password.
type Login struct {
	User     string `json:"user"`
	Password string `json:"password"`
}

// Internal are the subjects only Triage may use: its own (enqueue
// streams, dequeue requests, ready notices, commits, health, failover),
// JetStream's API, acks and flow control, the KV buckets' subjects (the
// shard map, ownership and health live there), and the server's system
// subjects.
var Internal = []string{"triage.>", "$JS.>", "$KV.>", "$SYS.>"}

// TriagePermissions lets Triage's processes use its subjects, JetStream
// and KV, and replies (_INBOX), and nothing else: a leaked Triage password
// still cannot reach other tenants of a shared server's account.
func TriagePermissions() *server.Permissions {
	allow := []string{"triage.>", "$JS.>", "$KV.>", "_INBOX.>"}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: allow},
		Subscribe: &server.SubjectPermission{Allow: allow},
	}
}

// ClientPermissions forbid publishing and subscribing on Internal: a
// client reaches Triage through the router's API, whose authorization
// (routing/auth) NATS cannot apply.
func ClientPermissions() *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Deny: Internal},
		Subscribe: &server.SubjectPermission{Deny: Internal},
	}
}

// users is a's logins as server users.
func (a *Auth) users() ([]*server.User, error) {
	if a.Triage.User == "" || a.Triage.Password == "" {
		return nil, errors.New("natsserver: auth: the Triage login needs a user and a password")
	}
	out := []*server.User{{Username: a.Triage.User, Password: a.Triage.Password, Permissions: TriagePermissions()}}
	seen := map[string]bool{a.Triage.User: true}
	for _, c := range a.Clients {
		if c.User == "" || c.Password == "" {
			return nil, errors.New("natsserver: auth: a client login needs a user and a password")
		}
		if seen[c.User] {
			return nil, errors.New("natsserver: auth: user " + c.User + " is given twice")
		}
		seen[c.User] = true
		out = append(out, &server.User{Username: c.User, Password: c.Password, Permissions: ClientPermissions()})
	}
	return out, nil
}
