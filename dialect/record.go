package dialect

import (
	"bytes"
	"crypto/sha256"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Status is the state of a row: pending, then processing while a claim holds it, then
// delivered or dead (or pending again, to retry). The outbox package's documentation draws
// the transitions.
type Status string

// The four states of a row.
const (
	StatusPending    Status = "pending"
	StatusProcessing Status = "processing"
	StatusDelivered  Status = "delivered"
	StatusDead       Status = "dead"
)

// Valid reports whether s is one of the four states.
func (s Status) Valid() bool {
	switch s {
	case StatusPending, StatusProcessing, StatusDelivered, StatusDead:
		return true
	}
	return false
}

// Headers are string metadata carried beside the payload (trace context, content type,
// correlation ids). They are stored as a JSON object; Headers implements [driver.Valuer]
// and [sql.Scanner] so dialects can bind and scan them directly. A nil or empty map is
// stored as NULL.
type Headers map[string]string

// Value encodes h as a JSON object, or NULL when empty.
func (h Headers) Value() (driver.Value, error) {
	if len(h) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(map[string]string(h)) // sorted keys: the same map gives the same bytes
	if err != nil {
		return nil, err
	}
	return string(b), nil
}

// Scan decodes a JSON object (string or bytes) or NULL.
func (h *Headers) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case nil:
		*h = nil
		return nil
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		return fmt.Errorf("outbox: cannot scan %T into Headers", src)
	}
	if len(b) == 0 || string(b) == "null" {
		*h = nil
		return nil
	}
	m := map[string]string{}
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("outbox: scan headers: %w", err)
	}
	*h = m
	return nil
}

// Record is one row of the outbox table as it is stored: what [Dialect.Claim] and
// [Dialect.Get] return, and what the engine's Store.Claim, Store.Get and Store.ListDead
// hand on to their callers. Times are UTC; a zero time means NULL.
type Record struct {
	ID           uuid.UUID
	Namespace    string
	Topic        string
	TenantID     uuid.UUID // uuid.Nil when none
	DedupeKey    string
	PartitionKey string
	Headers      Headers
	Payload      json.RawMessage
	PayloadHash  []byte // SHA-256 of Payload taken at enqueue

	Status        Status
	Attempts      int
	NextAttemptAt time.Time
	LockedBy      string
	LockedUntil   time.Time
	LeaseToken    uuid.UUID
	LastError     string

	CreatedAt   time.Time
	UpdatedAt   time.Time
	DeliveredAt time.Time

	// Replays counts how often an operator moved the row from dead back to pending
	// ([Admin.Replay]). Get and ListDead read it; claims leave it zero.
	Replays int

	// HeadersErr is why the stored headers did not decode into [Headers] (Headers is then
	// nil): someone edited the table by hand. A [Dialect] sets it when it reads such a row
	// instead of failing the whole read ([ScanHeaders]), so one damaged row never fails a
	// claim; [Record.Integrity] reports it, and the engine's Publisher dead-letters the row.
	HeadersErr error
}

// Integrity reports whether the row is as it was enqueued: its payload matches the SHA-256
// taken at enqueue and its headers decode. A failure wraps [ErrIntegrity]. The engine's
// Publisher dead-letters such a row instead of publishing it.
func (r Record) Integrity() error {
	sum := sha256.Sum256(r.Payload)
	if !bytes.Equal(sum[:], r.PayloadHash) {
		return fmt.Errorf("%w: payload does not match the SHA-256 taken at enqueue", ErrIntegrity)
	}
	if r.HeadersErr != nil {
		return fmt.Errorf("%w: headers: %v", ErrIntegrity, r.HeadersErr)
	}
	return nil
}

// Lease returns the lease by which the current claim holds the row.
func (r Record) Lease() Lease { return Lease{ID: r.ID, Token: r.LeaseToken} }
