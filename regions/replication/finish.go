package replication

import (
	"context"
	"database/sql"
	"fmt"
)

// FinishPromotion completes the promotion of a server that an earlier
// Promote detached from its old primary (it replicates from nobody) but
// that may not have reached the end: semi-sync as a primary with no
// fallback, then read_only=0. Both statements are idempotent, so it also
// serves a server whose promotion did finish, and one that was restarted
// since with RejoinArgs (read-only, a semi-sync replica).
//
// Only the server a failover claimed for the current epoch may be finished
// this way: it was chosen holding everything the old primary acknowledged.
// A deposed primary that replicates from nobody because it has not been
// rejoined yet looks the same to Status, and must never be finished.
func (a *Admin) FinishPromotion(ctx context.Context) error {
	f := a.flavor
	return a.session(ctx, func(c *sql.Conn) error {
		st, err := a.status(ctx, c)
		if err != nil {
			return err
		}
		if st.Role != RolePrimary {
			return fmt.Errorf("replication: finish the promotion of %s: it replicates from %s", a.addr, st.PrimaryAddr)
		}
		return a.exec(ctx, c, "semi-sync as a primary, unfence (read_only=0)", append(f.SemiSync(true, NoFallback), f.SetReadOnly(false))...)
	})
}
