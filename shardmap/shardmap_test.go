package shardmap

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const twoShards = `{"version":1,"regions":["us-east","eu-west"],
 "shards":[{"id":1,"home_region":"us-east","primary":"127.0.0.1:3307"},{"id":2,"home_region":"us-east","primary":"127.0.0.1:3308"},
           {"id":3,"home_region":"eu-west","primary":"127.0.0.1:3309","replicas":["127.0.0.1:3310"]}],
 "namespaces":[{"name":"default"},{"name":"pinned","shards":{"us-east":[2]},"default_lease_duration":"1m"}]}`

func TestParseAndResolve(t *testing.T) {
	t.Parallel()
	m, err := Parse([]byte(twoShards))
	require.NoError(t, err)
	ids, err := m.ShardsFor("default", "us-east")
	require.NoError(t, err)
	require.Equal(t, []uint32{1, 2}, ids)
	ids, err = m.ShardsFor("pinned", "us-east")
	require.NoError(t, err)
	require.Equal(t, []uint32{2}, ids)
	ids, err = m.ShardsFor("pinned", "eu-west")
	require.NoError(t, err)
	require.Equal(t, []uint32{3}, ids)
	_, err = m.ShardsFor("nope", "us-east")
	require.ErrorIs(t, err, ErrUnknownNamespace)
	_, err = m.ShardsFor("default", "mars")
	require.ErrorIs(t, err, ErrNoShards)
	ns, err := m.Namespace("pinned")
	require.NoError(t, err)
	require.Equal(t, time.Minute, time.Duration(ns.DefaultLeaseDuration))
	require.Equal(t, DefaultMaxPayloadBytes, ns.MaxPayloadBytes)
	s, ok := m.Shard(1)
	require.True(t, ok)
	require.Equal(t, "triage", s.Database)

	// A marshalled map parses back to the same content.
	data, err := m.Marshal()
	require.NoError(t, err)
	again, err := Parse(data)
	require.NoError(t, err)
	require.Equal(t, m.Shards, again.Shards)
	require.Equal(t, m.Namespaces, again.Namespaces)
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	for name, doc := range map[string]string{
		"no regions":    `{"version":1}`,
		"bad home":      `{"regions":["a"],"shards":[{"id":1,"home_region":"b","primary":"x:1"}]}`,
		"dup shard":     `{"regions":["a"],"shards":[{"id":1,"home_region":"a","primary":"x:1"},{"id":1,"home_region":"a","primary":"x:2"}]}`,
		"no primary":    `{"regions":["a"],"shards":[{"id":1,"home_region":"a"}]}`,
		"unknown shard": `{"regions":["a"],"namespaces":[{"name":"n","shards":{"a":[9]}}]}`,
		"foreign shard": `{"regions":["a","b"],"shards":[{"id":1,"home_region":"b","primary":"x:1"}],
			"namespaces":[{"name":"n","shards":{"a":[1]}}]}`,
		"bad name":        `{"regions":["a"],"namespaces":[{"name":"has space"}]}`,
		"dup namespace":   `{"regions":["a"],"namespaces":[{"name":"n"},{"name":"n","max_attempts":3}]}`,
		"bad duration":    `{"regions":["a"],"namespaces":[{"name":"n","default_lease_duration":"soon"}]}`,
		"lease too short": `{"regions":["a"],"namespaces":[{"name":"n","default_lease_duration":"1ms"}]}`,
		"not json":        `{`,
	} {
		_, err := Parse([]byte(doc))
		require.Error(t, err, name)
	}
}

func TestHolderOffersOnlyNewer(t *testing.T) {
	t.Parallel()
	m1, err := Parse([]byte(twoShards))
	require.NoError(t, err)
	h := NewHolder(m1)
	m0 := *m1
	m0.Version = 0
	require.False(t, h.Offer(&m0))
	m2 := *m1
	m2.Version = 2
	require.True(t, h.Offer(&m2))
	require.Equal(t, uint64(2), h.Current().Version)
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(twoShards))
	f.Add([]byte(`{"regions":["a"]}`))
	f.Add([]byte(`{"regions":["a"],"namespaces":[{"name":"n","shards":{"a":[]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			return
		}
		// A valid map survives a round trip.
		out, err := m.Marshal()
		require.NoError(t, err)
		_, err = Parse(out)
		require.NoError(t, err)
	})
}

// TestDedupSlotsFilledPerRegion: a namespace without slot tables gets one
// per region over that region's shards (listed or by default), sorted; the
// tables survive a marshal round trip and shard-list changes, so a dedup
// key keeps its shard in its region, and a key's shard is always one of
// the request's region.
func TestDedupSlotsFilledPerRegion(t *testing.T) {
	t.Parallel()
	m, err := Parse([]byte(twoShards))
	require.NoError(t, err)
	for name, want := range map[string]map[string][]uint32{
		"default": {"us-east": {1, 2}, "eu-west": {3}},
		"pinned":  {"us-east": {2}, "eu-west": {3}},
	} {
		ns, err := m.Namespace(name)
		require.NoError(t, err)
		require.Len(t, ns.Slots, len(want), name)
		for region, ids := range want {
			require.Len(t, ns.Slots[region], DedupSlots, "%s %s", name, region)
			for i, id := range ns.Slots[region] {
				require.Equal(t, ids[i%len(ids)], id, "%s %s slot %d", name, region, i)
			}
		}
	}

	// Round trip: the stored tables are read back as they are.
	data, err := m.Marshal()
	require.NoError(t, err)
	require.Contains(t, string(data), `"slot_tables":[{"cycle":[3]},{"cycle":[1,2]},{"cycle":[2]}]`, "each distinct table once, regions in order")
	require.Contains(t, string(data), `"dedup_slot_refs":{"eu-west":0,"us-east":2}`)
	again, err := Parse(data)
	require.NoError(t, err)
	require.Equal(t, m.Namespaces, again.Namespaces)

	// A key's shard is one of the asking region's, and stays after the
	// region's shard list grows with the tables carried over.
	def, _ := m.Namespace("default")
	east := map[uint32]bool{}
	for i := range 200 {
		key := fmt.Sprint("k", i)
		s, ok := def.DedupShard("us-east", "t", key)
		require.True(t, ok)
		east[s] = true
		s, ok = def.DedupShard("eu-west", "t", key)
		require.True(t, ok)
		require.Equal(t, uint32(3), s)
	}
	require.Equal(t, map[uint32]bool{1: true, 2: true}, east, "keys spread over the region's shards")
	_, ok := def.DedupShard("mars", "t", "k")
	require.False(t, ok)

	pinned, _ := m.Namespace("pinned")
	shard, ok := pinned.DedupShard("us-east", "t", "key-1")
	require.True(t, ok)
	require.Equal(t, uint32(2), shard)
	grown := *pinned
	grown.Shards = map[string][]uint32{"us-east": {1, 2}}
	next, err := m.WithNamespace(grown)
	require.NoError(t, err)
	after, _ := next.Namespace("pinned")
	require.Equal(t, pinned.Slots, after.Slots)
	for i := range 200 {
		got, _ := after.DedupShard("us-east", "t", fmt.Sprint("k", i))
		require.Equal(t, uint32(2), got, "a shard added later takes no dedup keys")
	}
}

// TestDedupSlotsFilledForANewRegion: a region added to the map gets its
// table when the namespace first has shards there; the other regions'
// tables are kept as they are.
func TestDedupSlotsFilledForANewRegion(t *testing.T) {
	t.Parallel()
	one, err := New(Map{Regions: []string{"a"}, Shards: []Shard{{ID: 1, HomeRegion: "a", Primary: "x:1"}}, Namespaces: []Namespace{{Name: "n"}}})
	require.NoError(t, err)
	before, _ := one.Namespace("n")
	require.Equal(t, []string{"a"}, slices.Sorted(maps.Keys(before.Slots)))

	two, err := New(Map{Version: 2, Regions: []string{"a", "b"}, Namespaces: one.Namespaces,
		Shards: []Shard{{ID: 1, HomeRegion: "a", Primary: "x:1"}, {ID: 2, HomeRegion: "b", Primary: "x:2"}, {ID: 3, HomeRegion: "b", Primary: "x:3"}}})
	require.NoError(t, err)
	after, _ := two.Namespace("n")
	require.Equal(t, before.Slots["a"], after.Slots["a"])
	require.Len(t, after.Slots["b"], DedupSlots)
	for i, id := range after.Slots["b"] {
		require.Equal(t, []uint32{2, 3}[i%2], id, "slot %d", i)
	}
}

// TestDedupSlotsLegacyTableDropped: a stored namespace-wide table (a JSON
// array, which could name shards of any region) is replaced on load by a
// table per region.
func TestDedupSlotsLegacyTableDropped(t *testing.T) {
	t.Parallel()
	legacy := make([]string, DedupSlots)
	for i := range legacy {
		legacy[i] = fmt.Sprint([]int{1, 2, 3}[i%3])
	}
	m, err := Parse([]byte(`{"version":1,"regions":["us-east","eu-west"],
 "shards":[{"id":1,"home_region":"us-east","primary":"x:1"},{"id":2,"home_region":"us-east","primary":"x:2"},{"id":3,"home_region":"eu-west","primary":"x:3"}],
 "namespaces":[{"name":"n","dedup_slots":[` + strings.Join(legacy, ",") + `]}]}`))
	require.NoError(t, err)
	ns, _ := m.Namespace("n")
	require.Equal(t, []string{"eu-west", "us-east"}, slices.Sorted(maps.Keys(ns.Slots)))
	require.NotContains(t, ns.Slots["us-east"], uint32(3))
	require.Equal(t, []uint32{3}, slices.Compact(slices.Clone(ns.Slots["eu-west"])))

	_, err = Parse([]byte(`{"regions":["a"],"namespaces":[{"name":"n","dedup_slots":"x"}]}`))
	require.ErrorContains(t, err, "dedup_slots must map a region")
}

// TestDedupSlotsValidated: a region's slot table names only the
// namespace's shards in that region and has DedupSlots entries; a table
// for an unknown region is refused; a namespace with no shards anywhere
// has no tables until it gets some.
func TestDedupSlotsValidated(t *testing.T) {
	t.Parallel()
	m, err := Parse([]byte(twoShards))
	require.NoError(t, err)
	pinned, _ := m.Namespace("pinned") // us-east over 2, eu-west over 3

	// Dropping shard 2, which us-east's slots name, is refused and says why.
	shrunk := *pinned
	shrunk.Shards = map[string][]uint32{"us-east": {1}}
	_, err = m.WithNamespace(shrunk)
	require.ErrorContains(t, err, `region "us-east": dedup slot 0 names shard 2`)
	require.ErrorContains(t, err, "dedup tombstones")

	withTable := func(region string, table []uint32) Namespace {
		ns := *pinned
		ns.Slots = maps.Clone(pinned.Slots)
		ns.Slots[region] = table
		return ns
	}
	_, err = m.WithNamespace(withTable("us-east", pinned.Slots["us-east"][:10]))
	require.ErrorContains(t, err, "exactly 256")

	unknown := slices.Clone(pinned.Slots["us-east"])
	unknown[7] = 99
	_, err = m.WithNamespace(withTable("us-east", unknown))
	require.ErrorContains(t, err, "dedup slot 7 names shard 99")

	// A shard of another region cannot take a region's keys.
	foreign := slices.Clone(pinned.Slots["us-east"])
	foreign[5] = 3
	_, err = m.WithNamespace(withTable("us-east", foreign))
	require.ErrorContains(t, err, `region "us-east": dedup slot 5 names shard 3`)

	_, err = m.WithNamespace(withTable("mars", pinned.Slots["us-east"]))
	require.ErrorContains(t, err, `table for region "mars", which is not in regions`)

	empty, err := New(Map{Regions: []string{"a"}, Namespaces: []Namespace{{Name: "n"}}})
	require.NoError(t, err)
	ns, _ := empty.Namespace("n")
	require.Empty(t, ns.Slots)
	_, ok := ns.DedupShard("a", "t", "k")
	require.False(t, ok)
}

// TestDedupSlotTablesWrittenAsCycles: a table that repeats a cycle of
// shards is written as the cycle and read back whole; one that does not
// (a slot moved) is written in full; a bad cycle is refused.
func TestDedupSlotTablesWrittenAsCycles(t *testing.T) {
	t.Parallel()
	cyclic := make([]uint32, DedupSlots)
	for i := range cyclic {
		cyclic[i] = []uint32{4, 7, 9}[i%3]
	}
	moved := slices.Clone(cyclic)
	moved[200] = 4 // was 9
	distinct := make([]uint32, DedupSlots)
	for i := range distinct {
		distinct[i] = uint32(i + 1)
	}
	in := DedupSlotTables{"a": cyclic, "b": moved, "c": distinct, "d": slices.Repeat([]uint32{5}, DedupSlots)}
	data, err := json.Marshal(in)
	require.NoError(t, err)
	require.Contains(t, string(data), `"a":{"cycle":[4,7,9]}`)
	require.Contains(t, string(data), `"d":{"cycle":[5]}`)
	require.Contains(t, string(data), `"b":[4,7,9,4,`)
	var out DedupSlotTables
	require.NoError(t, json.Unmarshal(data, &out))
	require.Equal(t, in, out)

	for _, bad := range []string{`{"a":{"cycle":[]}}`, `{"a":{"cycle":"x"}}`} {
		require.ErrorContains(t, json.Unmarshal([]byte(bad), &out), "a cycle must list 1 to 256 shard IDs", bad)
	}
}

// TestStoredMapSharesSlotTables: namespaces with the same slot table store
// it once; the map reads back as it was; a reference to a table the map
// does not list is refused.
func TestStoredMapSharesSlotTables(t *testing.T) {
	t.Parallel()
	in := Map{Version: 1, Regions: []string{"a", "b"}}
	for i := uint32(1); i <= 600; i++ {
		in.Shards = append(in.Shards, Shard{ID: i, HomeRegion: []string{"a", "b"}[i%2], Primary: fmt.Sprintf("db%d:3306", i)})
	}
	for n := range 200 {
		in.Namespaces = append(in.Namespaces, Namespace{Name: fmt.Sprintf("t%d", n)})
	}
	in.Namespaces = append(in.Namespaces, Namespace{Name: "pinned", Shards: map[string][]uint32{"a": {2, 4}}})
	m, err := New(in)
	require.NoError(t, err)
	data, err := m.Marshal()
	require.NoError(t, err)
	require.Less(t, len(data), 100_000, "201 namespaces of 300 shards a region: 3 distinct tables, not 402 (480 KB)")
	again, err := Parse(data)
	require.NoError(t, err)
	require.Equal(t, m.Namespaces, again.Namespaces)

	bad := strings.Replace(string(data), `"dedup_slot_refs":{"a":`, `"dedup_slot_refs":{"a":7`, 1)
	_, err = Parse([]byte(bad))
	require.ErrorContains(t, err, "names table 7")
}
