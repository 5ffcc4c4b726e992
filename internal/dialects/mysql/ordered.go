package mysql

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
	"github.com/outboxgo/outbox/internal/dialects/sqlkit"
)

// Ordered claims on MySQL and MariaDB find a key's head through the order index
// (namespace, order_key, created_at, id), where order_key is a virtual column holding the
// partition key while a row with a key is pending, processing or dead, the empty string
// (never a partition key) while a row without a key is pending or processing, and NULL
// otherwise: the stand-in for two partial indexes. The head check (mysqlHead) is one
// descent of it, which reads the index alone:
//
//	(`outbox_events`.partition_key IS NULL OR `outbox_events`.id = (
//	    SELECT e.id FROM `outbox_events` e FORCE INDEX (`outbox_events_order_idx`)
//	    WHERE e.namespace = `outbox_events`.namespace AND e.order_key = `outbox_events`.partition_key
//	      [AND e.status <> 'dead']
//	    ORDER BY e.created_at, e.id LIMIT 1))
//
// The pending rows are not taken with one locking walk of the claim index, as an unordered
// claim takes them, but in two steps (mysqlClaimHeads): a plain read of the claim index
// finds the heads among the first pending rows, in (created_at, id) order, and a locking
// read by primary key, FOR UPDATE SKIP LOCKED, locks as many as the claim wants of those
// still pending and due. A locking read does not lock the rows its subqueries read, and
// how each server treats a subquery inside a SKIP LOCKED read is not something to build a
// guarantee on; a plain read is a consistent snapshot on both. Expired leases are found by
// the same plain read as for an unordered claim, with the head check added, and locked the
// same way. With a namespace, the plain read of pending rows is bounded to a window
// (mysqlWindow), and the heads beyond it are found by visiting the keys (mysqlHeadsByKey),
// whose heads are checked again after locking. The visits take the keys in turn: each
// starts after the last key the one before it dealt with (mysqlVisits).
//
// Why two claimers never hold two rows of one key: the plain read is one snapshot, and a
// row stops holding its key back only by becoming delivered (terminal) or being deleted.
// So when a claimer sees r as the head, every earlier row of r's key is gone for good, and
// any other claimer can take only r itself; the locking read re-checks r's own status
// under its row lock, which one claimer at a time holds. Within one claim, a later row of a
// key sees the earlier one pending and is not read.

// mysqlOrdered renders the head check for the claim's reads, or "" for an unordered claim.
func mysqlOrdered(t dialect.Table, p dialect.ClaimParams) string {
	if !p.Ordered {
		return ""
	}
	return ` AND ` + mysqlHead(t, mysqlTable(t), p.OrderedSkipDead)
}

// mysqlHead renders the condition under which the row named outer may be claimed in order
// (see orderedHead). An order-index entry under a partition key is a row that holds its
// key back: order_key is the row's partition key only while it is pending, processing or
// dead. So the default check needs no status term and reads the order index alone, without
// a lookup of the entry's row (about a tenth of the pages per check); with skipDead the
// status of the key's first entries is read from their rows.
func mysqlHead(t dialect.Table, outer string, skipDead bool) string {
	return `(` + outer + `.partition_key IS NULL OR ` + outer + `.id = (SELECT e.id FROM ` + mysqlTable(t) + ` e FORCE INDEX (` +
		sqlkit.QuoteIdent(t.Index("order"), '`') + `) WHERE e.namespace = ` + outer + `.namespace AND e.order_key = ` + outer + `.partition_key` +
		mysqlSkipDead(skipDead) + ` ORDER BY e.created_at, e.id LIMIT 1))`
}

// mysqlSkipDead renders the term that passes over dead rows in a read of the order index
// aliased e, or "" when dead rows hold their key back (the entry's key says as much).
func mysqlSkipDead(skipDead bool) string {
	if skipDead {
		return ` AND e.status <> 'dead'`
	}
	return ``
}

// mysqlClaimHeads locks up to n due pending rows that are their key's head (or have no
// key), oldest first, on tx. With a namespace it runs in two steps, as the claims on the
// other databases do: a walk of the claim index bounded to the first orderedWindow(n)
// pending rows in scope (mysqlWindow), then, when that locked fewer than n rows and there
// are pending rows beyond the window, a visit of the keys (mysqlHeadsByKey). Without a
// namespace the walk has no bound. It passes over taken, rows this transaction has locked
// already (a continued claim's runs, mysqlContinuable): they are still pending in its own
// reads, the first of each key its head, and a transaction's own locks never skip.
func mysqlClaimHeads(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams, n int, taken []dialect.Record, visits *mysqlVisits) ([]dialect.Record, int64, error) {
	if p.Namespace == "" {
		// Twice n: concurrent claimers read the same heads and skip each other's locks, so
		// a margin keeps their batches full.
		ids, err := mysqlFind(ctx, tx, t, p, mysqlDue, 2*n, nil)
		if err != nil {
			return nil, 0, err
		}
		return mysqlLockFirst(ctx, tx, t, p, mysqlNotTaken(ids, taken), n)
	}
	heads, edge, beyond, err := mysqlWindow(ctx, tx, t, p, sqlkit.OrderedWindow(n))
	if err != nil {
		return nil, 0, err
	}
	heads = mysqlNotTaken(heads, taken)
	// The candidates are not cut to the share: the lock skips the heads that another
	// claimer holds and takes the next ones (cut to twice a share of one, two held heads
	// left the claim empty with a third free).
	share := sqlkit.HeadShare(p, len(heads), n)
	recs, now, err := mysqlLockFirst(ctx, tx, t, p, heads[:min(2*n, len(heads))], share)
	if err == nil && p.Runs {
		// The runs of the window's heads, before a visit of the keys that a hot key's run
		// often makes needless.
		var runs []dialect.Record
		var now2 int64
		runs, now2, err = mysqlClaimRuns(ctx, tx, t, p, recs, n-len(recs))
		recs, now = append(recs, runs...), max(now, now2)
	}
	if err != nil || len(recs) == n || !beyond || share < n && len(recs) > 0 {
		return recs, now, err // with a share taken, the keys beyond the window are the other claimers'
	}
	more, now2, err := mysqlHeadsByKey(ctx, tx, t, p, n-len(recs), edge, slices.Concat(taken, recs), visits)
	if err != nil {
		return nil, 0, err
	}
	recs = append(recs, more...)
	dialect.SortClaimed(recs)
	return recs, max(now, now2), nil
}

// mysqlNotTaken returns the ids that are not among taken.
func mysqlNotTaken(ids []uuid.UUID, taken []dialect.Record) []uuid.UUID {
	if len(taken) == 0 {
		return ids
	}
	return slices.DeleteFunc(ids, func(id uuid.UUID) bool {
		return slices.ContainsFunc(taken, func(r dialect.Record) bool { return r.ID == id })
	})
}

// mysqlWindow is the bounded walk: one plain read of the claim index that returns the first
// window+1 pending rows in scope, in claim order, each with whether it is due and its key's
// head. It returns the ids of those that are, in claim order; the position of the last row
// read, the edge; and whether the read reached the edge, so that pending rows may lie
// beyond it. The head check runs on the rows read and no others: how many rows the walk
// reads does not depend on how many of them are held back.
func mysqlWindow(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams, window int) (heads []uuid.UUID, edge mysqlPosition, beyond bool, err error) {
	tbl := mysqlTable(t)
	a := &dialect.Args{}
	eligible := `next_attempt_at <= UTC_TIMESTAMP(6) AND attempts < ` + a.Add(p.MaxAttempts) + ` AND ` + mysqlHead(t, tbl, p.OrderedSkipDead)
	rows, err := tx.QueryContext(ctx, `SELECT id, `+mysqlMicros(`created_at`)+`, `+eligible+` FROM `+tbl+
		` FORCE INDEX (`+sqlkit.QuoteIdent(t.Index("claim"), '`')+`) WHERE status = 'pending'`+sqlkit.ScopeSQL(a, p.Scope, "", sqlkit.UUIDBytes)+
		` ORDER BY created_at, id LIMIT `+a.Add(window+1), a.Values...)
	if err != nil {
		return nil, edge, false, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var ok sql.NullBool
		if err := rows.Scan(&edge.id, &edge.at, &ok); err != nil {
			return nil, edge, false, err
		}
		if ok.Bool {
			heads = append(heads, edge.id)
		}
		n++
	}
	return heads, edge, n > window, rows.Err()
}

// mysqlLockFirst locks, by primary key and FOR UPDATE SKIP LOCKED, n of the candidates ids
// that are still due and not locked by another claim, the first by id, and returns them in
// claim order with the clock. Concurrent claimers read the same candidates; each skips the
// rows the others locked and takes the next ones, in one statement. It locks no more than
// it takes: a margin locked until commit would be rows no other claimer can take.
// Taking the first by id rather than by (created_at, id) only changes which of the oldest
// heads a claim takes: the library's ids are time-ordered.
func mysqlLockFirst(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams, ids []uuid.UUID, n int) ([]dialect.Record, int64, error) {
	recs, now, err := mysqlLock(ctx, tx, t, p, mysqlDue, ids, n)
	if err != nil {
		return nil, 0, err
	}
	dialect.SortClaimed(recs)
	return recs, now, nil
}

// mysqlPosition is a row's place in claim order: created_at in Unix microseconds, then id.
type mysqlPosition struct {
	at int64
	id uuid.UUID
}

// mysqlVisitStep is how many order-index entries one statement of the key visit reads.
const mysqlVisitStep = 32

// mysqlHeadsByKey is the key visit. It goes through the keys of p.Namespace in key order,
// from where the visit before it stopped (visits) to the last key and round from the
// first, a step of mysqlVisitStep order-index entries per statement starting after the
// last key of the step before, and looks up each key's first entry, its head; it stops
// once it has somewhat more than n heads that are due. It adds as many of the oldest rows
// without a key beyond the window (past edge), read from the order index's entries under
// the empty key, locks those of all these that are not among taken, checks again, under
// the locks, that each is still its key's head, and returns the oldest n that are. It
// reads at most mysqlVisitStep index entries and a head per key visited, and the live
// rows without a key past the edge, however many rows wait behind the heads.
func mysqlHeadsByKey(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams, n int, edge mysqlPosition, taken []dialect.Record, visits *mysqlVisits) ([]dialect.Record, int64, error) {
	tbl := mysqlTable(t)
	order := tbl + ` e FORCE INDEX (` + sqlkit.QuoteIdent(t.Index("order"), '`') + `)`
	// One statement per step, with the last key of the step before it bound: neither
	// server skips through an index on a virtual column by itself (MariaDB 10.11 takes no
	// loose index scan for GROUP BY order_key), and in a recursive query the lookup of the
	// next key, which depends on the key before it, reads the order index from the
	// namespace's first entry each time, a full pass per key. A step reads the next
	// mysqlVisitStep entries of the order index and looks up the head of each key among
	// them: one key per step when keys have many rows waiting, many when they have few.
	a := &dialect.Args{}
	next, err := tx.PrepareContext(ctx, `SELECT d.pk, (SELECT h.id FROM `+tbl+` h FORCE INDEX (PRIMARY) WHERE h.id = (SELECT e.id FROM `+order+
		` WHERE e.namespace = `+a.Add(p.Namespace)+` AND e.order_key = d.pk`+mysqlSkipDead(p.OrderedSkipDead)+` ORDER BY e.created_at, e.id LIMIT 1)`+
		` AND h.status = 'pending' AND h.next_attempt_at <= UTC_TIMESTAMP(6) AND h.attempts < `+a.Add(p.MaxAttempts)+sqlkit.ScopeSQL(a, p.Scope, "h.", sqlkit.UUIDBytes)+
		`) FROM (SELECT DISTINCT s.order_key AS pk FROM (SELECT e.order_key FROM `+order+` WHERE e.namespace = `+a.Add(p.Namespace)+
		` AND e.order_key > ? ORDER BY e.order_key LIMIT `+strconv.Itoa(mysqlVisitStep)+`) s) d ORDER BY d.pk`)
	if err != nil {
		return nil, 0, err
	}
	defer next.Close()
	// want leaves a margin for the heads concurrent claimers lock first.
	want := n + n/4 + 1
	cursor := mysqlVisitAt{t.Name(), p.Namespace}
	start := visits.load(cursor)
	type visited struct {
		key  string
		head uuid.UUID // uuid.Nil when the key's head is not due or in flight
	}
	var (
		seen  []visited   // in visit order
		keyed []uuid.UUID // due heads, in visit order
	)
	// Partition keys are never empty (an empty key is no key), so every key sorts after "".
	for after, wrapped := start, false; len(keyed) < want; {
		rows, err := next.QueryContext(ctx, append(slices.Clone(a.Values), after)...)
		if err != nil {
			return nil, 0, err
		}
		last, round := "", false
		for rows.Next() && len(keyed) < want {
			var (
				pk []byte
				id uuid.NullUUID
			)
			if err := rows.Scan(&pk, &id); err != nil {
				rows.Close()
				return nil, 0, err
			}
			if wrapped && string(pk) > start {
				round = true // back where the visit started
				break
			}
			seen = append(seen, visited{string(pk), id.UUID})
			if id.Valid {
				keyed = append(keyed, id.UUID)
			}
			last = string(pk)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, 0, err
		}
		if round || wrapped && last == start {
			break
		}
		if last == "" {
			// Past the last key: go round, unless the visit started at the first key.
			if wrapped || start == "" {
				break
			}
			last, wrapped = "", true
		}
		after = last
	}

	a = &dialect.Args{}
	unkeyed, err := dialect.QueryIDs(ctx, tx, `SELECT e.id FROM `+order+
		` WHERE e.namespace = `+a.Add(p.Namespace)+` AND e.order_key = '' AND (e.created_at > `+mysqlFromMicros(a.Add(edge.at))+
		` OR (e.created_at = `+mysqlFromMicros(a.Add(edge.at))+` AND e.id > `+a.Add(sqlkit.UUIDBytes(edge.id))+`))`+
		` AND e.status = 'pending' AND e.next_attempt_at <= UTC_TIMESTAMP(6) AND e.partition_key IS NULL AND e.attempts < `+a.Add(p.MaxAttempts)+
		sqlkit.ScopeSQL(a, p.Scope, "e.", sqlkit.UUIDBytes)+` ORDER BY e.created_at, e.id LIMIT `+a.Add(want), a.Values...)
	if err != nil {
		return nil, 0, err
	}
	held := make(map[uuid.UUID]bool, len(taken))
	for _, r := range taken {
		held[r.ID] = true
	}
	var ids []uuid.UUID
	for _, id := range slices.Concat(keyed, unkeyed) {
		if !held[id] {
			held[id] = true
			ids = append(ids, id)
		}
	}
	recs, now, err := mysqlLock(ctx, tx, t, p, mysqlDue, ids, 0)
	if err != nil {
		return nil, 0, err
	}
	if recs, err = mysqlStillHeads(ctx, tx, t, p, recs); err != nil {
		return nil, 0, err
	}
	dialect.SortClaimed(recs)
	recs = recs[:min(n, len(recs))]
	// The next visit starts after the keys this one has dealt with: those without a due
	// head and those whose head it takes, up to the first key whose head it leaves, which
	// the next visit considers again. Keys are taken in turn, and none is passed over.
	got := make(map[uuid.UUID]bool, len(recs))
	for _, r := range recs {
		got[r.ID] = true
	}
	resume := start
	for _, v := range seen {
		if v.head != uuid.Nil && !got[v.head] {
			break
		}
		resume = v.key
	}
	visits.store(cursor, resume)
	return recs, now, nil
}

// mysqlStillHeads returns the records of recs, rows this claim has locked, that are still
// their key's head. The key visit found them in snapshots taken before they were locked;
// the check runs in a snapshot taken after. A row that is still its key's head then stays
// so until the claim commits: the rows before it are gone for good, and no one else can
// take it.
func mysqlStillHeads(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams, recs []dialect.Record) ([]dialect.Record, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	a := &dialect.Args{}
	heads, err := dialect.QueryIDs(ctx, tx, `SELECT id FROM `+mysqlTable(t)+` FORCE INDEX (PRIMARY) WHERE id IN `+
		a.List(len(recs), func(i int) any { return sqlkit.UUIDBytes(recs[i].ID) })+mysqlOrdered(t, p), a.Values...)
	if err != nil {
		return nil, err
	}
	still := make(map[uuid.UUID]bool, len(heads))
	for _, id := range heads {
		still[id] = true
	}
	return slices.DeleteFunc(recs, func(r dialect.Record) bool { return !still[r.ID] }), nil
}

// BlockedKeys implements [dialect.OrderedClaimer].
func (Dialect) BlockedKeys(ctx context.Context, q dialect.DBTX, t dialect.Table, p dialect.BlockedKeysParams) ([]dialect.BlockedKey, error) {
	a := &dialect.Args{}
	query := sqlkit.BlockedKeysQuery(mysqlTable(t), "order_key", ` FORCE INDEX (`+sqlkit.QuoteIdent(t.Index("order"), '`')+`)`, a, p, sqlkit.UUIDBytes)
	return sqlkit.QueryBlockedKeys(ctx, q, query, a.Values)
}

// mysqlVisits remembers, per table and namespace, the key after which the next key visit
// of an ordered claim starts: the last of the keys the visit before it dealt with, in
// turn, those without a due head and those whose head it took. A key whose head a visit
// found but left (it had older candidates) is the next visit's first, so that the keys are
// taken in turn and none is passed over. It is a hint, not a guarantee: a visit that
// starts anywhere goes round all the keys before it gives up, and the heads it finds are
// checked under their locks. Concurrent visits from one starting key find the same heads
// and skip each other's locks.
type mysqlVisits struct {
	mu sync.Mutex
	at map[mysqlVisitAt]string
}

// mysqlVisitAt names the keys a visit goes through: a table's name and a namespace.
type mysqlVisitAt struct{ table, namespace string }

// mysqlMaxVisits bounds how many table and namespace pairs mysqlVisits remembers; past it,
// it forgets them all (and the next visits start at the first key).
const mysqlMaxVisits = 1024

func (v *mysqlVisits) load(at mysqlVisitAt) string {
	if v == nil {
		return ""
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.at[at]
}

func (v *mysqlVisits) store(at mysqlVisitAt, key string) {
	if v == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.at[at]; !ok && len(v.at) >= mysqlMaxVisits || v.at == nil {
		v.at = make(map[mysqlVisitAt]string)
	}
	v.at[at] = key
}

// mysqlClaimRuns locks, on tx, the runs ([dialect.ClaimParams.Runs]) of heads, rows this
// claim has locked in order, up to n rows in all, and returns them with the clock. Two
// statements: a plain read of the order index, one range per keyed head (a UNION ALL of
// its next n entries after the head, each with whether it can be claimed now), from which
// sqlkit.RunTake keeps each key's claimable prefix, in turns across the keys; then the
// locking read by primary key, FOR UPDATE SKIP LOCKED, that re-checks each row under its
// lock (mysqlLock); each key's run is cut at its first row not locked (sqlkit.RunCut). The
// claim's UPDATE then leases them with the heads.
//
// No other claimer can take a row of a run: its key's head is locked by this transaction,
// pending in every other claimer's snapshot until the commit and processing after it, so
// the row is no other claimer's head; a locking read sees the latest committed row, and
// the re-check under the lock leaves out a row that changed since the plain read. The
// plain read locks nothing and the locking read never waits (SKIP LOCKED, by primary key,
// no gap locks under READ COMMITTED), so runs add no lock order for settles to deadlock
// with. Rows locked and then cut stay locked, unchanged, until the commit.
func mysqlClaimRuns(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams, heads []dialect.Record, n int) ([]dialect.Record, int64, error) {
	var keyed []dialect.Record
	for _, h := range heads {
		if h.PartitionKey != "" {
			keyed = append(keyed, h)
		}
	}
	return mysqlRunsAfter(ctx, tx, t, p, sqlkit.RunHeads(keyed), n)
}

// mysqlRunsAfter is the run claim of mysqlClaimRuns from the rows after, each of a key and
// one this transaction holds locked with every earlier row of its key gone or delivered:
// a head it locked, or a row its settle just delivered ([dialect.ClaimParams.Continue]),
// which other claimers see processing until the commit, as they see a locked head pending.
func mysqlRunsAfter(ctx context.Context, tx *sql.Tx, t dialect.Table, p dialect.ClaimParams, after []sqlkit.RunHead, n int) ([]dialect.Record, int64, error) {
	if n <= 0 || len(after) == 0 {
		return nil, 0, nil
	}
	order := mysqlTable(t) + ` e FORCE INDEX (` + sqlkit.QuoteIdent(t.Index("order"), '`') + `)`
	read := func(from []sqlkit.RunHead, keys []int, limit int) ([]sqlkit.RunRow, error) {
		a := &dialect.Args{}
		var b strings.Builder
		for i, h := range from {
			if i > 0 {
				b.WriteString(` UNION ALL `)
			}
			b.WriteString(`(SELECT ` + strconv.Itoa(keys[i]) + `, e.id, e.status = 'pending' AND e.next_attempt_at <= UTC_TIMESTAMP(6) AND e.attempts < ` + a.Add(p.MaxAttempts) +
				sqlkit.ScopeSQL(a, p.Scope, "e.", sqlkit.UUIDBytes) + `, ` + mysqlMicros(`e.created_at`) + ` FROM ` + order +
				` WHERE e.namespace = ` + a.Add(h.Namespace) + ` AND e.order_key = ` + a.Add(h.PartitionKey) + mysqlSkipDead(p.OrderedSkipDead) +
				` AND (e.created_at > ` + mysqlFromMicros(a.Add(h.At)) + ` OR (e.created_at = ` + mysqlFromMicros(a.Add(h.At)) + ` AND e.id > ` + a.Add(sqlkit.UUIDBytes(h.ID)) + `))` +
				` ORDER BY e.created_at, e.id LIMIT ` + a.Add(limit) + `)`)
		}
		rows, err := sqlkit.QueryAll(ctx, tx, b.String(), a.Values, func(s sqlkit.RowScanner) (sqlkit.RunRow, error) {
			var (
				r  sqlkit.RunRow
				ok sql.NullBool
			)
			err := s.Scan(&r.Key, &r.ID, &ok, &r.At)
			r.OK = ok.Bool
			return r, err
		})
		sqlkit.SortRuns(rows)
		return rows, err
	}
	runs, err := sqlkit.ReadRuns(after, n, read)
	if err != nil {
		return nil, 0, err
	}
	ids := slices.Concat(runs...)
	locked, now, err := mysqlLock(ctx, tx, t, p, mysqlDue, ids, 0)
	if err != nil {
		return nil, 0, err
	}
	byID := make(map[uuid.UUID]dialect.Record, len(locked))
	for _, r := range locked {
		byID[r.ID] = r
	}
	var out []dialect.Record
	for _, id := range sqlkit.RunCut(runs, func(id uuid.UUID) bool { _, ok := byID[id]; return ok }) {
		out = append(out, byID[id])
	}
	return out, now, nil
}

// mysqlLoneKeys returns the records of recs whose key no other record of recs has: heads
// whose run this claim has not taken. Taking a run twice would lock its rows twice (a
// transaction's own locks never skip), and return them twice.
func mysqlLoneKeys(recs []dialect.Record) []dialect.Record {
	type key struct{ ns, pk string }
	n := make(map[key]int, len(recs))
	for _, r := range recs {
		n[key{r.Namespace, r.PartitionKey}]++
	}
	var lone []dialect.Record
	for _, r := range recs {
		if n[key{r.Namespace, r.PartitionKey}] == 1 {
			lone = append(lone, r)
		}
	}
	return lone
}
