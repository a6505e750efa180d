// Package client is a small Go client for Triage's gRPC API.
//
// Dial returns a Client that holds one gRPC connection to a router and
// exposes the generated stubs as Queue and Admin, so every RPC in
// proto/triage/v1 is available with its full request. A few convenience
// methods (Enqueue, Dequeue, Ack, Nack) cover the common consumer and
// producer loop without building requests by hand:
//
//	c, err := client.Dial(ctx, "127.0.0.1:9090", client.WithRegion("eu"))
//	if err != nil { ... }
//	defer c.Close()
//	items, err := c.Dequeue(ctx, "default", "emails", 10, time.Minute, 5*time.Second)
//	for _, it := range items {
//		if err := send(it.Payload); err != nil {
//			_ = c.Nack(ctx, "default", it, 30*time.Second, err.Error())
//			continue
//		}
//		_, _ = c.Ack(ctx, "default", it)
//	}
//
// # Regions
//
// Enqueue, Dequeue, GetTopicStats and ListTopics name a region; left empty,
// the router uses its own. WithRegion sets a default for the requests whose
// region is empty, including those sent through Queue directly. It is filled
// in by a unary interceptor on a copy of the request, so a caller's request
// is never changed and may be reused. Calls that take an item ID need no
// region: the ID names its shard.
//
// # Transport
//
// Dial uses plaintext (insecure) credentials, which suit the loopback bed.
// WithDialOptions adds gRPC dial options, for example TLS credentials, which
// replace the plaintext default. Dial does not wait for the connection: the
// first RPC does, under its own context.
//
// # Errors
//
// RPC failures are gRPC status errors (use status.Code). Batch calls succeed
// as a whole and report each item in an ItemResult; Nack, which takes a
// single item, turns a failed result into an *ItemError.
package client
