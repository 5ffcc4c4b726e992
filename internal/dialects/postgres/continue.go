package postgres

import (
	"context"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox/dialect"
)

// pgContinuable returns, of the keys of outcomes just settled in q's transaction, the last
// row of each key whose rows there are all delivered now ([dialect.ClaimParams.Continue]).
// It reads the rows as the settle left them in this transaction: a row put back for a
// retry, buried, or whose lease was lost (another claimer's, not delivered) keeps its key
// from being continued.
func pgContinuable(ctx context.Context, q dialect.DBTX, t dialect.Table, outcomes []dialect.Outcome) ([]uuid.UUID, error) {
	ids := pgUUIDArray(len(outcomes), func(i int) uuid.UUID { return outcomes[i].ID })
	return dialect.QueryIDs(ctx, q, `SELECT id FROM (SELECT id, bool_and(status = 'delivered') OVER k AS ok,`+
		` row_number() OVER (k ORDER BY created_at DESC, id DESC) AS rn FROM `+pgTable(t)+
		` WHERE id = ANY($1::uuid[]) AND partition_key IS NOT NULL WINDOW k AS (PARTITION BY namespace, partition_key)) x WHERE ok AND rn = 1`, ids)
}
