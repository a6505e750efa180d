package bench

import (
	"bufio"
	"context"
	"database/sql"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Machine describes where the numbers came from.
type Machine struct {
	Cores      int    `json:"cores"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPU        string `json:"cpu,omitempty"`
	MemoryMB   int    `json:"memory_mb,omitempty"`
	OS         string `json:"os"`
	Kernel     string `json:"kernel,omitempty"`
	GoVersion  string `json:"go_version"`
	// MariaDBVersion is SELECT VERSION() of the first shard.
	MariaDBVersion string `json:"mariadb_version"`
	// Durability holds the first shard's settings that decide what a
	// commit costs and guarantees, read from the server.
	Durability map[string]string `json:"durability"`
	// Tuning holds other server settings that move the numbers.
	Tuning map[string]string `json:"tuning"`
	// Note says what shares the box.
	Note string `json:"note"`
	// Postgres describes the server River's rows ran on; nil when they
	// did not run.
	Postgres *PostgresFacts `json:"postgres,omitempty"`
}

var durabilityVars = []string{
	"innodb_flush_log_at_trx_commit", "sync_binlog", "binlog_format", "log_bin", "innodb_doublewrite",
	"innodb_flush_method", "gtid_strict_mode", "log_slave_updates", "rpl_semi_sync_master_enabled",
	"rpl_semi_sync_master_wait_point",
}

var tuningVars = []string{
	"innodb_buffer_pool_size", "innodb_log_file_size", "innodb_io_capacity", "max_connections",
	"binlog_commit_wait_count", "binlog_commit_wait_usec", "tx_isolation",
}

func machineFacts(ctx context.Context, db *sql.DB) (Machine, error) {
	m := Machine{
		Cores:      runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		OS:         runtime.GOOS + "/" + runtime.GOARCH,
		GoVersion:  runtime.Version(),
		CPU:        procField("/proc/cpuinfo", "model name"),
		Durability: map[string]string{},
		Tuning:     map[string]string{},
		Note: "one box runs everything: the shards' mariadbd processes, the embedded NATS server, the Triage node and the load " +
			"generators share its cores and its disk; queue sessions use READ COMMITTED (the server default is listed under tuning); " +
			"River's rows run on a private Postgres once the one-region bed is stopped",
	}
	if kb, err := strconv.Atoi(strings.Fields(procField("/proc/meminfo", "MemTotal") + " 0")[0]); err == nil {
		m.MemoryMB = kb / 1024
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&m.MariaDBVersion); err != nil {
		return m, err
	}
	vars := map[string]string{}
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL VARIABLES")
	if err != nil {
		return m, err
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return m, err
		}
		vars[k] = v
	}
	if err := rows.Err(); err != nil {
		return m, err
	}
	for _, k := range durabilityVars {
		if v, ok := vars[k]; ok {
			m.Durability[k] = v
		}
	}
	for _, k := range tuningVars {
		if v, ok := vars[k]; ok {
			m.Tuning[k] = v
		}
	}
	return m, nil
}

// procField returns the value of the first "key: value" line of a /proc
// file, or "".
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// loadAvg returns the 1-minute load average, or 0 where /proc has none.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
