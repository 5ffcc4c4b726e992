// Package dialecttest holds the fixtures the built-in dialects' tests share: a table worth
// planning on, the ordered backlog and the statements whose plans they read. Only tests
// import it.
package dialecttest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/dialect"
)

// PlanRows fills store's table with 2000 delivered, 200 dead and 2000 pending rows through
// the API, so that a plan has a table worth an index to read.
func PlanRows(ctx context.Context, t *testing.T, store *outbox.Store) {
	t.Helper()
	msgs := make([]outbox.Message, 1000)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: "orders", Topic: "order.created", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
	}
	for range 4 {
		_, err := store.EnqueueStandalone(ctx, msgs...)
		require.NoError(t, err)
	}
	o := outbox.ClaimOptions{Limit: outbox.MaxBatch, Lease: time.Minute, MaxAttempts: 5, WorkerID: "plan"}
	for i := range 2 {
		recs, err := store.Claim(ctx, o)
		require.NoError(t, err)
		require.Len(t, recs, outbox.MaxBatch)
		var out []outbox.Outcome
		for j, r := range recs {
			status := outbox.StatusDelivered
			if i == 1 && j < 200 {
				status = outbox.StatusDead
			}
			out = append(out, outbox.Outcome{Lease: r.Lease(), Status: status})
		}
		require.NoError(t, store.Complete(ctx, out...))
	}
}

// InspectFilter is a dead filter with every term the web view sets: the plans must still
// read the dead rows through the retention index.
var InspectFilter = outbox.DeadFilter{
	Scope:         outbox.Scope{Namespace: "orders", Topics: []string{"order.created"}},
	Since:         time.Now().Add(-24 * time.Hour),
	ErrorContains: "refused",
}

// Statement is one statement of a dialect with its arguments, for an EXPLAIN test.
type Statement struct {
	Name  string
	Query string
	Args  []any
}

// InspectSQL returns the statements of the inspection calls of one dialect for filter f,
// rendered by its functions: the two reads of DeadGroups (groups, then total), Activity's
// read of one status, and GetByDedupeKey's.
func InspectSQL(t dialect.Table, f dialect.DeadFilter,
	groups func(dialect.Table, dialect.DeadGroupsParams) (string, string, []any, []any),
	activity func(dialect.Table, dialect.Status) string, dedupe func(dialect.Table) string) []Statement {
	p := dialect.DeadGroupsParams{DeadFilter: f, Limit: outbox.DefaultDeadGroupsLimit}
	g, tq, ga, ta := groups(t, p)
	// Activity's limit is below the rows in the window, as on a busy table, so that the
	// plan is the walk that stops at the limit.
	window, limit := int64(3600_000_000), 100
	return []Statement{
		{"dead groups", g, ga},
		{"dead total", tq, ta},
		{"activity delivered", activity(t, dialect.StatusDelivered), []any{window, limit}},
		{"activity dead", activity(t, dialect.StatusDead), []any{window, limit}},
		{"dedupe key", dedupe(t), []any{"orders", "order.created", "k-1"}},
	}
}

// EnqueueOne enqueues m in a transaction of its own.
func EnqueueOne(s *outbox.Store, ctx context.Context, m outbox.Message) (outbox.Result, error) {
	rs, err := s.EnqueueStandalone(ctx, m)
	if err != nil {
		return outbox.Result{}, err
	}
	return rs[0], nil
}
