package replication

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// GTID is one MariaDB global transaction ID, written "domain-server-seq".
// Within a replication domain, sequence numbers only grow (GTID strict mode
// enforces it), so seq alone orders the transactions of a domain.
type GTID struct {
	Domain   uint32
	ServerID uint32
	Seq      uint64
}

// String formats g as MariaDB does: "0-1-42".
func (g GTID) String() string {
	return strconv.FormatUint(uint64(g.Domain), 10) + "-" +
		strconv.FormatUint(uint64(g.ServerID), 10) + "-" +
		strconv.FormatUint(g.Seq, 10)
}

// GTIDList is a MariaDB replication position such as @@gtid_current_pos or
// Gtid_IO_Pos: the last GTID of each domain, at most one per domain, sorted
// by domain. The empty list is the position of a server that has seen no
// transactions. Build it with ParseGTIDList; the zero value is the empty
// position.
type GTIDList []GTID

// ParseGTIDList parses a comma-separated list of "domain-server-seq" GTIDs,
// as MariaDB prints positions. Blanks around elements are allowed; the
// empty string is the empty position. It rejects two GTIDs of one domain,
// because a position holds one per domain and silently keeping either would
// misreport how far a server got.
func ParseGTIDList(s string) (GTIDList, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return GTIDList{}, nil
	}
	parts := strings.Split(s, ",")
	l := make(GTIDList, 0, len(parts))
	for _, p := range parts {
		g, err := parseGTID(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("replication: GTID list %q: %w", s, err)
		}
		l = append(l, g)
	}
	slices.SortFunc(l, func(a, b GTID) int { return cmpUint(a.Domain, b.Domain) })
	for i := 1; i < len(l); i++ {
		if l[i].Domain == l[i-1].Domain {
			return nil, fmt.Errorf("replication: GTID list %q: domain %d appears twice; a position holds one GTID per domain", s, l[i].Domain)
		}
	}
	return l, nil
}

func parseGTID(s string) (GTID, error) {
	f := strings.Split(s, "-")
	if len(f) != 3 {
		return GTID{}, fmt.Errorf("element %q: want domain-server-seq, e.g. 0-1-42", s)
	}
	domain, err1 := strconv.ParseUint(f[0], 10, 32)
	server, err2 := strconv.ParseUint(f[1], 10, 32)
	seq, err3 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return GTID{}, fmt.Errorf("element %q: domain and server id must be unsigned 32-bit and seq unsigned 64-bit decimal numbers", s)
	}
	return GTID{Domain: uint32(domain), ServerID: uint32(server), Seq: seq}, nil
}

// String formats l as MariaDB accepts it, e.g. in MASTER_GTID_WAIT:
// "0-1-42,1-2-7". The empty list is "".
func (l GTIDList) String() string {
	parts := make([]string, len(l))
	for i, g := range l {
		parts[i] = g.String()
	}
	return strings.Join(parts, ",")
}

// Get returns the GTID l holds for domain.
func (l GTIDList) Get(domain uint32) (GTID, bool) {
	i, ok := slices.BinarySearchFunc(l, domain, func(g GTID, d uint32) int { return cmpUint(g.Domain, d) })
	if !ok {
		return GTID{}, false
	}
	return l[i], true
}

// Covers reports whether a server at position l has every transaction a
// server at position o has: in each domain of o, l is further along, or at
// the same GTID. Equal sequence numbers with different server ids are two
// different transactions (diverged histories), so neither covers the other.
// A missing domain counts as sequence number 0, which no transaction has.
func (l GTIDList) Covers(o GTIDList) bool {
	for _, g := range o {
		mine, ok := l.Get(g.Domain)
		switch {
		case !ok:
			if g.Seq > 0 {
				return false
			}
		case mine.Seq < g.Seq:
			return false
		case mine.Seq == g.Seq && mine.ServerID != g.ServerID && g.Seq > 0:
			return false
		}
	}
	return true
}

// Compare orders two positions of one replication history: it returns -1
// if l is behind o, +1 if l is ahead of o and 0 if they are equal, with
// ok true. ok is false when neither covers the other: l is ahead in one
// domain and behind in another, or they hold different transactions at the
// same sequence number. Such positions cannot be ranked, and promoting
// either would lose the other's transactions.
func (l GTIDList) Compare(o GTIDList) (c int, ok bool) {
	lo, ol := l.Covers(o), o.Covers(l)
	switch {
	case lo && ol:
		return 0, true
	case lo:
		return 1, true
	case ol:
		return -1, true
	}
	return 0, false
}

// Merge returns, per domain, the further along of l's and o's GTIDs (l's on
// a tie). It combines a replica's received position (Gtid_IO_Pos) with its
// applied one (gtid_slave_pos) into how far it got.
func (l GTIDList) Merge(o GTIDList) GTIDList {
	out := slices.Clone(l)
	for _, g := range o {
		i, found := slices.BinarySearchFunc(out, g.Domain, func(x GTID, d uint32) int { return cmpUint(x.Domain, d) })
		switch {
		case !found:
			out = slices.Insert(out, i, g)
		case g.Seq > out[i].Seq:
			out[i] = g
		}
	}
	if out == nil {
		out = GTIDList{}
	}
	return out
}

func cmpUint[T uint32 | uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
