package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/transport/amqp"
)

// newAMQP measures against a topic exchange of its own named ns, bound with the routing key
// topic to a durable queue of its own also named ns, so that every message is routable and
// persistent messages are written to disk before they are confirmed. Both are deleted by
// close; should the bench be killed, the queue expires after an hour unused and the
// auto-delete exchange goes with its last binding.
func newAMQP(_ context.Context, url, ns string) (*broker, error) {
	admin, err := amqp091.Dial(url)
	if err != nil {
		return nil, err
	}
	ach, err := admin.Channel()
	if err == nil {
		err = ach.ExchangeDeclare(ns, amqp091.ExchangeTopic, true, true, false, false, nil)
	}
	if err == nil {
		_, err = ach.QueueDeclare(ns, true, false, false, false, amqp091.Table{"x-expires": int32(3_600_000)})
	}
	if err == nil {
		err = ach.QueueBind(ns, topic, ns, false, nil)
	}
	if err != nil {
		_ = admin.Close()
		return nil, fmt.Errorf("declare: %w", err)
	}
	cleanup := func() {
		_ = ach.ExchangeDelete(ns, false, false)
		_, _ = ach.QueueDelete(ns, false, false, false)
		_ = admin.Close()
	}
	tr, err := outboxamqp.New(outboxamqp.Options{URL: url, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		cleanup()
		return nil, err
	}
	client, closeClient, err := amqpClient(url)
	if err != nil {
		cleanup()
		return nil, err
	}
	return &broker{
		name: "amqp", transport: tr, client: client,
		stored: func(context.Context) (int64, error) {
			q, err := ach.QueueDeclarePassive(ns, true, false, false, false, amqp091.Table{"x-expires": int32(3_600_000)})
			return int64(q.Messages), err
		},
		reset: func(context.Context) error {
			_, err := ach.QueuePurge(ns, false)
			return err
		},
		close: func() {
			_ = tr.Close()
			closeClient()
			cleanup()
		},
	}, nil
}

var errNacked = errors.New("nacked by the broker")

// amqpClient is what a careful hand-written relay does with amqp091-go: one connection, one
// channel in confirm mode shared by every batch, each message published with the mandatory
// flag and the transport's fields and headers, then every confirmation awaited and the
// broker's returns checked.
func amqpClient(url string) (outbox.Transport, func(), error) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	// The client hands a return over before it handles the confirmation of the same
	// message; returns are recorded by message id and looked up once a batch is confirmed.
	var mu sync.Mutex
	returned := map[string]amqp091.Return{}
	returns := ch.NotifyReturn(make(chan amqp091.Return))
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for r := range returns {
			mu.Lock()
			returned[r.MessageId] = r
			mu.Unlock()
		}
	}()
	client := outbox.TransportFunc(func(ctx context.Context, ds []outbox.Delivery) []error {
		errs := make([]error, len(ds))
		pending := make([]*amqp091.DeferredConfirmation, len(ds))
		for i, d := range ds {
			pending[i], errs[i] = ch.PublishWithDeferredConfirmWithContext(ctx, d.Namespace, d.Topic, true, false, amqp091.Publishing{
				Headers: amqp091.Table{
					outboxamqp.HeaderNamespace:    d.Namespace,
					outboxamqp.HeaderTopic:        d.Topic,
					outboxamqp.HeaderAttempt:      int64(d.Attempt),
					outboxamqp.HeaderPartitionKey: d.PartitionKey,
				},
				ContentType:  "application/json",
				DeliveryMode: amqp091.Persistent,
				MessageId:    d.ID.String(),
				Timestamp:    d.CreatedAt,
				Type:         d.Topic,
				Body:         d.Payload,
			})
		}
		for i, dc := range pending {
			if dc == nil {
				continue
			}
			acked, err := dc.WaitContext(ctx)
			switch {
			case err != nil:
				errs[i] = err
			case !acked:
				errs[i] = errNacked
			}
		}
		mu.Lock()
		for i, d := range ds {
			if r, ok := returned[d.ID.String()]; ok {
				delete(returned, d.ID.String())
				if errs[i] == nil {
					errs[i] = fmt.Errorf("returned: %d %s", r.ReplyCode, r.ReplyText)
				}
			}
		}
		mu.Unlock()
		return errs
	})
	return client, func() {
		_ = conn.Close()
		<-drained
	}, nil
}
