package provision

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// WaitJetStream polls, for up to timeout, until every server of urls
// answers JetStream requests and a bucket of replicas copies can be
// created through the first: the meta leader is elected and every peer is
// known. Both beds wait so before anything creates the nodes' buckets.
// opts are extra connection options (the Triage login).
func WaitJetStream(ctx context.Context, urls []string, replicas int, timeout time.Duration, opts ...nats.Option) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for i, url := range urls {
		nc, err := nats.Connect(url, append([]nats.Option{nats.Name("triage-provision"), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1)}, opts...)...)
		if err != nil {
			return err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return err
		}
		err = Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
			if _, err := js.AccountInfo(ctx); err != nil {
				return err
			}
			if i > 0 {
				return nil
			}
			// Once, through the first server: a replicated bucket proves placement.
			const probe = "triage_bed_probe"
			if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: probe, Replicas: replicas, Storage: jetstream.MemoryStorage}); err != nil {
				return err
			}
			return js.DeleteKeyValue(ctx, probe)
		})
		nc.Close()
		if err != nil {
			return fmt.Errorf("JetStream of %s not ready within %v: %w", url, timeout, err)
		}
	}
	return nil
}
