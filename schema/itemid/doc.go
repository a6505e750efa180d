// Package itemid allocates and parses Triage item IDs.
//
// An item ID names its shard and a 64-bit key that is unique inside the
// whole deployment, so an ack, nack or get is routed by parsing the ID,
// without a lookup (FOQS: shard ID + primary key).
//
// # Keys
//
// Keys are snowflake-style: 41 bits of milliseconds since Epoch (1 January
// 2025, UTC), 10 bits of node ID and 12 bits of sequence. They are
// allocated by the router that accepts the item, before the insert, with
// no database round trip. A node ID is claimed in NATS KV (see routing's
// node claim), so two routers never share one. Time order gives InnoDB
// inserts at the right edge of the primary key, and makes the id
// tiebreak in (priority, deliver_after, id) FIFO.
//
// # External form
//
// "<shard>-<key as 16 hex digits>", for example "2-0193a4b5c6d7e8f9". The
// fixed width keeps string order equal to key order. Clients must treat it
// as opaque.
package itemid
