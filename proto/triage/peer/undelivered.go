package peer

import (
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
	"github.com/triage-queue/triage/schema/store"
)

// UndeliveredByShard groups served items that never reached a consumer by
// shard, for store.ItemUnserve: each with the lease token it was served
// under and the deliver_after it had before (LeasedItem.deliver_after).
func UndeliveredByShard(items []*triagev1.LeasedItem) (map[uint32][]store.Undelivered, error) {
	out := map[uint32][]store.Undelivered{}
	for _, it := range items {
		id, err := itemid.Parse(it.Id)
		if err != nil {
			return nil, err
		}
		tok, err := store.ParseToken(it.LeaseToken)
		if err != nil {
			return nil, err
		}
		out[id.Shard] = append(out[id.Shard], store.Undelivered{LeaseRef: store.LeaseRef{Key: id.Key, Token: tok},
			DeliverAfterUS: it.GetDeliverAfter().AsTime().UnixMicro()})
	}
	return out, nil
}
