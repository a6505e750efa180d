package peer

import (
	"fmt"
	"strconv"
	"strings"
)

// InboxPrefix is the reply prefix of every NATS connection of Triage's
// processes (nats.CustomInboxPrefix; shardmap.NATSOptions sets it): the
// answers to dequeue requests, to JetStream and KV requests, and pull and
// watch deliveries all arrive under it. It is outside the "_INBOX." that
// nats.go uses by default, so natsserver can deny it to client logins,
// which would otherwise read other tenants' payloads and lease tokens off
// the replies or answer in Triage's place.
const InboxPrefix = "_TRIAGE_INBOX"

// EnqueueSubject is where routers publish shard's enqueue batches in
// region, into the region's enqueue stream (see EnqueueStream).
func EnqueueSubject(region string, shard uint32) string {
	return fmt.Sprintf("triage.enq.%s.%d", region, shard)
}

// EnqueueNowSubject carries the fast copy of an envelope the stream
// acknowledged on EnqueueSubject(region, shard), over core NATS to the
// worker draining it (see package enqueuer, Fast copies). It is outside
// the stream's subjects.
func EnqueueNowSubject(region string, shard uint32) string {
	return fmt.Sprintf("triage.enqnow.%s.%d", region, shard)
}

// EnqueueSubjects matches every shard's EnqueueSubject in region.
func EnqueueSubjects(region string) string { return "triage.enq." + region + ".*" }

// EnqueueStream is the JetStream stream that buffers region's enqueues.
func EnqueueStream(region string) string {
	return "TRIAGE_ENQ_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(region))
}

// ReadySubject is where new ready items of a namespace are announced
// (ItemsReady). The namespace is one subject token: a name may contain
// '.', which would split it into several and miss the dequeuers'
// "triage.ready.*" subscription, so '.' is written as '~', which names
// cannot contain (shardmap.ValidName).
func ReadySubject(namespace string) string {
	return "triage.ready." + strings.ReplaceAll(namespace, ".", "~")
}

// DequeueSubject is where dequeuer id takes ShardDequeue requests.
func DequeueSubject(id string) string { return "triage.dq." + id }

// UnbufferSubject is where dequeuer id takes Unbuffer requests.
func UnbufferSubject(id string) string { return "triage.dqu." + id }

// OwnersBucket is the NATS KV bucket of dequeuer sessions (SessionKey)
// and the roles' presence (PresenceKey). Its TTL expires the key of a
// process that stopped refreshing it.
const OwnersBucket = "triage_owners"

// ClaimsBucket is the NATS KV bucket of shard ownership: key OwnerKey,
// value the owning dequeuer's ID. Its keys do not expire: a claim stands
// while its holder's session (SessionKey in OwnersBucket) does, so a
// dequeuer refreshes one key however many shards it owns.
const ClaimsBucket = "triage_claims"

// OwnerKey is shard's key in ClaimsBucket.
func OwnerKey(shard uint32) string { return fmt.Sprintf("shard.%d", shard) }

// OwnerShard reads the shard of a ClaimsBucket key; ok is false for keys
// of other kinds.
func OwnerShard(key string) (shard uint32, ok bool) {
	rest, found := strings.CutPrefix(key, "shard.")
	if !found {
		return 0, false
	}
	id, err := strconv.ParseUint(rest, 10, 32)
	return uint32(id), err == nil
}

// SessionKey is dequeuer id's session in OwnersBucket, refreshed while it
// lives; its claims in ClaimsBucket stand as long as it does.
func SessionKey(id string) string { return "session." + id }

// SessionID reads the dequeuer of an OwnersBucket session key; ok is
// false for keys of other kinds (PresenceKey).
func SessionID(key string) (id string, ok bool) { return strings.CutPrefix(key, "session.") }

// PresenceKey is where role's processes of region announce themselves in
// OwnersBucket (its TTL expires the key when they are all gone): adopters
// of a region's shards hand them back once it is present again.
func PresenceKey(role, region string) string { return "present." + role + "." + region }

// DrillsBucket is the NATS KV bucket of failover drills' progress
// (Admin ReportDrill, ListDrills): one key per drill, its value the
// drill as JSON. The bucket's TTL forgets a drill a day after its last
// report.
const DrillsBucket = "triage_drills"
