package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/migrations"
)

// An operator's round: count the backlog, list what died and why, replay it once the cause
// is fixed, and purge old rows.
func ExampleStore_Stats() {
	ctx := context.Background()
	db, cleanup := openExampleDB()
	defer cleanup()
	if err := migrations.Up(ctx, db, "sqlite", migrations.Options{}); err != nil {
		log.Fatal(err)
	}
	store, err := outbox.New(db, outbox.SQLite(), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	msg := outbox.Message{Namespace: "shop", Topic: "order.paid", Payload: []byte(`{"order_id":"o-1"}`)}
	if _, err := store.EnqueueStandalone(ctx, msg, msg, msg); err != nil {
		log.Fatal(err)
	}
	// A publisher tried one message and the broker refused it for good.
	recs, err := store.Claim(ctx, outbox.ClaimOptions{Limit: 1, Lease: time.Minute, MaxAttempts: 5, WorkerID: "w"})
	if err != nil {
		log.Fatal(err)
	}
	err = store.Nack(ctx, outbox.DefaultRetryPolicy(), outbox.Failure{
		Lease: recs[0].Lease(), Attempts: recs[0].Attempts, Err: outbox.Permanent(errors.New("schema rejected")),
	})
	if err != nil {
		log.Fatal(err)
	}

	st, err := store.Stats(ctx, outbox.Scope{Namespace: "shop"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("pending %d, dead %d\n", st.Pending, st.Dead)

	page, err := store.ListDead(ctx, outbox.ListDeadOptions{})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range page.Records {
		fmt.Printf("dead: %s after %d attempt(s): %s\n", r.Topic, r.Attempts, r.LastError)
	}

	res, err := store.Replay(ctx, page.Records[0].ID)
	if err != nil {
		log.Fatal(err)
	}
	r, err := store.Get(ctx, res.Replayed[0])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("replayed: %s, attempts %d, replays %d\n", r.Status, r.Attempts, r.Replays)

	purged, err := store.Purge(ctx, outbox.PurgeOptions{DeliveredOlderThan: 24 * time.Hour, DeadOlderThan: 7 * 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("purged %d delivered, %d dead\n", purged.Delivered, purged.Dead)
	// Output:
	// pending 2, dead 1
	// dead: order.paid after 1 attempt(s): permanent: schema rejected
	// replayed: pending, attempts 0, replays 1
	// purged 0 delivered, 0 dead
}
