package replication_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/regions/replication"
)

func TestParseGTIDList(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, want string // want "" with wantErr false means the empty list
		wantErr        string
	}{
		{name: "empty", in: "", want: ""},
		{name: "blank", in: " \n", want: ""},
		{name: "one", in: "0-1-42", want: "0-1-42"},
		{name: "sorted by domain", in: "2-9-1,0-1-5,1-2-3", want: "0-1-5,1-2-3,2-9-1"},
		{name: "blanks around elements", in: " 0-1-5 ,\n1-2-3 ", want: "0-1-5,1-2-3"},
		{name: "leading zeros", in: "00-01-007", want: "0-1-7"},
		{name: "maxima", in: "4294967295-4294967295-18446744073709551615", want: "4294967295-4294967295-18446744073709551615"},
		{name: "two fields", in: "0-1", wantErr: "want domain-server-seq"},
		{name: "four fields", in: "0-1-2-3", wantErr: "want domain-server-seq"},
		{name: "negative", in: "-1-2-3", wantErr: "want domain-server-seq"},
		{name: "letters", in: "a-1-2", wantErr: "unsigned"},
		{name: "sign", in: "0-1-+2", wantErr: "unsigned"},
		{name: "inner blank", in: "0-1- 2", wantErr: "unsigned"},
		{name: "domain overflow", in: "4294967296-1-1", wantErr: "unsigned 32-bit"},
		{name: "seq overflow", in: "0-1-18446744073709551616", wantErr: "64-bit"},
		{name: "empty element", in: "0-1-2,", wantErr: "want domain-server-seq"},
		{name: "leading comma", in: ",0-1-2", wantErr: "want domain-server-seq"},
		{name: "duplicate domain", in: "0-1-2,0-3-4", wantErr: "domain 0 appears twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, err := replication.ParseGTIDList(tc.in)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.ErrorContains(t, err, "GTID list", "the error quotes the input")
				return
			}
			require.NoError(t, err)
			require.NotNil(t, l)
			require.Equal(t, tc.want, l.String())
		})
	}
}

func TestGTIDListGet(t *testing.T) {
	t.Parallel()
	l := mustParse(t, "0-1-5,3-2-9")
	g, ok := l.Get(3)
	require.True(t, ok)
	require.Equal(t, replication.GTID{Domain: 3, ServerID: 2, Seq: 9}, g)
	_, ok = l.Get(1)
	require.False(t, ok)
}

func TestGTIDListCompare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, a, b string
		want       int
		ok         bool
	}{
		{"equal", "0-1-5", "0-1-5", 0, true},
		{"both empty", "", "", 0, true},
		{"behind", "0-1-4", "0-1-5", -1, true},
		{"ahead", "0-1-6", "0-1-5", 1, true},
		{"ahead after failover, other server id", "0-2-7", "0-1-5", 1, true},
		{"empty is behind", "", "0-1-1", -1, true},
		{"extra domain is ahead", "0-1-5,1-3-1", "0-1-5", 1, true},
		{"seq 0 counts as nothing", "0-1-5,1-3-0", "0-1-5", 0, true},
		{"ahead in one domain, behind in another", "0-1-6,1-1-1", "0-1-5,1-1-2", 0, false},
		{"same seq, different server: diverged", "0-1-5", "0-2-5", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := mustParse(t, tc.a), mustParse(t, tc.b)
			c, ok := a.Compare(b)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, c)
			c, ok = b.Compare(a)
			require.Equal(t, tc.ok, ok, "symmetric")
			require.Equal(t, -tc.want, c, "antisymmetric")
			require.Equal(t, tc.want >= 0 && tc.ok, a.Covers(b))
		})
	}
}

func TestGTIDListMerge(t *testing.T) {
	t.Parallel()
	io := mustParse(t, "0-1-60")
	applied := mustParse(t, "0-1-20,1-4-3")
	require.Equal(t, "0-1-60,1-4-3", io.Merge(applied).String())
	require.Equal(t, "0-1-60,1-4-3", applied.Merge(io).String())
	require.Equal(t, "0-1-20,1-4-3", applied.String(), "Merge does not modify its receiver")
	require.Equal(t, "", replication.GTIDList(nil).Merge(nil).String())
}

func mustParse(t *testing.T, s string) replication.GTIDList {
	t.Helper()
	l, err := replication.ParseGTIDList(s)
	require.NoError(t, err)
	return l
}

// gtidSeeds are positions as MariaDB prints them plus malformed ones; they
// run as ordinary tests in go test and seed go test -fuzz.
var gtidSeeds = []string{
	"", "0-1-1", "0-1-42,1-2-7", "1-2-7,0-1-42", " 0-1-5 ,\n1-2-3 ", "0-1-2,0-3-4",
	"4294967295-4294967295-18446744073709551615", "4294967296-1-1", "0-1", "0-1-2-3",
	"-1-2-3", "0-1-+2", ",", "0--1", "0-1-0", "007-0-00",
}

func FuzzParseGTIDList(f *testing.F) {
	for _, s := range gtidSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := replication.ParseGTIDList(s)
		if err != nil {
			return
		}
		// Canonical: sorted, one GTID per domain, and String round-trips.
		for i := 1; i < len(l); i++ {
			require.Less(t, l[i-1].Domain, l[i].Domain)
		}
		again, err := replication.ParseGTIDList(l.String())
		require.NoError(t, err, "String output %q must parse", l.String())
		require.Equal(t, l, again)
		// A position equals itself and merging it with itself changes nothing.
		c, ok := l.Compare(l)
		require.True(t, ok)
		require.Zero(t, c)
		require.Equal(t, l.String(), l.Merge(l).String())
	})
}

func FuzzGTIDListCompare(f *testing.F) {
	for _, a := range gtidSeeds {
		for _, b := range []string{"", "0-1-5", "0-2-5", "0-1-6,1-1-1"} {
			f.Add(a, b)
		}
	}
	f.Fuzz(func(t *testing.T, as, bs string) {
		a, errA := replication.ParseGTIDList(as)
		b, errB := replication.ParseGTIDList(bs)
		if errA != nil || errB != nil {
			return
		}
		ab, okAB := a.Compare(b)
		ba, okBA := b.Compare(a)
		require.Equal(t, okAB, okBA, "comparability is symmetric")
		require.Equal(t, ab, -ba, "order is antisymmetric")
		require.Equal(t, okAB && ab >= 0, a.Covers(b))
		m := a.Merge(b)
		require.True(t, m.Covers(a), "a merge has everything of its receiver")
		if okAB {
			// Comparable positions merge to the further one.
			hi := a
			if ab < 0 {
				hi = b
			}
			c, ok := m.Compare(hi)
			require.True(t, ok)
			require.Zero(t, c, "merge of %q and %q is %q", a, b, m)
		}
	})
}
