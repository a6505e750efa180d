package compose

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// AppLogin logs in to service's mariadbd as the application account from
// the Docker host, at the server's address on its region's network, and
// runs SELECT 1: over TLS verified with the bed's CA against the service's
// name (which the servers' certificate carries) when overTLS, else over
// plain TCP, which the bed's servers refuse (1045) because the bootstrap
// made the account REQUIRE SSL.
func (b *Bed) AppLogin(ctx context.Context, service string, overTLS bool) error {
	c, err := b.service(ctx, service)
	if err != nil {
		return err
	}
	ip, err := docker(ctx, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", c.ID)
	if err != nil {
		return err
	}
	if len(strings.Fields(ip)) == 0 {
		return fmt.Errorf("%s has no address", c.Service)
	}
	cred := shardmap.Credentials{User: provision.BedAccounts.App.User, Password: provision.BedAccounts.App.Password}
	if overTLS {
		cred.TLS = &shardmap.MySQLTLS{CAFile: filepath.Join(b.dir, bedCA), ServerName: c.Service}
	}
	if cred, err = cred.Resolve(); err != nil {
		return err
	}
	mc := mysql.NewConfig()
	cred.Apply(mc)
	mc.Net, mc.Addr, mc.Timeout = "tcp", net.JoinHostPort(strings.Fields(ip)[0], "3306"), 5*time.Second
	db, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var one int
	return db.QueryRowContext(qctx, "SELECT 1").Scan(&one)
}

// ServerStatus is service's mariadbd's replication status (SHOW SLAVE
// STATUS and the GTID positions), read as root over plain TCP as the
// drills' heals and Fate read it.
func (b *Bed) ServerStatus(ctx context.Context, service string) (replication.Status, error) {
	c, err := b.service(ctx, service)
	if err != nil {
		return replication.Status{}, err
	}
	a, err := b.admin(ctx, c)
	if err != nil {
		return replication.Status{}, err
	}
	defer a.Close()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return a.Status(sctx)
}
