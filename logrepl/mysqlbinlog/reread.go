package outboxbinlog

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// This file holds what a session does with the binlog it reads again: the stored position
// may lag the settled outcomes by up to PositionInterval, so a session that starts after a
// crash (or a lost connection) reads again rows that an earlier session settled.

// querier is what *sql.DB and *sql.Tx share for reading rows.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// leases reads which of the rows with ids exist (present) and which are still processing
// under the lease token that tokens gives them (held), outbox.MaxBatch ids a statement: one
// transaction's rows can be any number, and a statement takes at most 65,535 placeholders.
func (p *Publisher) leases(ctx context.Context, q querier, ids []uuid.UUID, tokens map[uuid.UUID]uuid.UUID) (present, held map[uuid.UUID]bool, err error) {
	present, held = map[uuid.UUID]bool{}, map[uuid.UUID]bool{}
	for part := range slices.Chunk(ids, outbox.MaxBatch) {
		if err := p.readLeases(ctx, q, part, tokens, present, held); err != nil {
			return nil, nil, err
		}
	}
	return present, held, nil
}

// readLeases adds to present and held what leases reports of ids, in one statement.
func (p *Publisher) readLeases(ctx context.Context, q querier, ids []uuid.UUID, tokens map[uuid.UUID]uuid.UUID, present, held map[uuid.UUID]bool) error {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id[:]
	}
	rows, err := q.QueryContext(ctx, `SELECT id, status, lease_token FROM `+quote(p.store.Table().Name())+
		` WHERE id IN (?`+strings.Repeat(`, ?`, len(ids)-1)+`)`, args...)
	if err != nil {
		return fmt.Errorf("outboxbinlog: read rows' leases: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, tok []byte
		var status string
		if err := rows.Scan(&id, &status, &tok); err != nil {
			return err
		}
		u, _ := uuid.FromBytes(id)
		t, _ := uuid.FromBytes(tok)
		present[u] = true
		held[u] = status == string(outbox.StatusProcessing) && t == tokens[u]
	}
	return rows.Err()
}

// skipSettled returns chunk without the rows that are no longer under their insert lease,
// while the session may be reading binlog that an earlier session delivered: those rows
// were settled by it or taken over by polling, and publishing them again would only be
// refused at the settle. Sessions settle in binlog order, so the settled rows come first;
// the checks (one read per batch) end with the first batch that has a row still under its
// lease and none to skip, since rows polling took over after an outage may be interleaved
// with leased ones. A row not found is published: it may not be visible yet.
func (s *session) skipSettled(ctx context.Context, chunk []outbox.Record) ([]outbox.Record, error) {
	if !s.rereading || s.p.mistake == noSkip {
		return chunk, nil
	}
	ids := make([]uuid.UUID, len(chunk))
	tokens := make(map[uuid.UUID]uuid.UUID, len(chunk))
	for i, r := range chunk {
		ids[i], tokens[r.ID] = r.ID, r.LeaseToken
	}
	present, held, err := s.p.leases(ctx, s.p.store.DB(), ids, tokens)
	if err != nil {
		return nil, err
	}
	keep := make([]outbox.Record, 0, len(chunk))
	leased := false
	for _, r := range chunk {
		switch {
		case held[r.ID]:
			leased = true
			keep = append(keep, r)
		case present[r.ID]:
			s.p.stats.skipped.Add(1)
		default:
			keep = append(keep, r)
		}
	}
	if leased && len(keep) == len(chunk) {
		s.rereading = false
	}
	return keep, nil
}
