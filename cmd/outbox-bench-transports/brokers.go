package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/transport/kafka"
	"github.com/outboxgo/outbox/transport/nats"
	"github.com/outboxgo/outbox/transport/redis"
)

// newNATS measures against a stream of its own capturing "<ns>.>", file-backed unless memory
// is set, which allows atomic batch publish when atomic is set.
func newNATS(ctx context.Context, url, ns string, atomic, memory bool) (*broker, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	storage := jetstream.FileStorage
	if memory {
		storage = jetstream.MemoryStorage
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: ns, Subjects: []string{ns + ".>"}, Storage: storage, AllowAtomicPublish: atomic})
	if err != nil {
		nc.Close()
		return nil, err
	}
	tr, err := outboxnats.New(js, outboxnats.Options{})
	if err != nil {
		nc.Close()
		return nil, err
	}
	client := outbox.TransportFunc(func(_ context.Context, ds []outbox.Delivery) []error {
		errs := make([]error, len(ds))
		futures := make([]jetstream.PubAckFuture, len(ds))
		for i, d := range ds {
			m := &nats.Msg{Subject: d.Namespace + "." + d.Topic, Data: d.Payload, Header: nats.Header{
				jetstream.MsgIDHeader:         {d.ID.String()},
				outboxnats.HeaderNamespace:    {d.Namespace},
				outboxnats.HeaderTopic:        {d.Topic},
				outboxnats.HeaderPartitionKey: {d.PartitionKey},
				outboxnats.HeaderAttempt:      {strconv.Itoa(d.Attempt)},
			}}
			futures[i], errs[i] = js.PublishMsgAsync(m)
		}
		for i, f := range futures {
			if f == nil {
				continue
			}
			select {
			case <-f.Ok():
			case err := <-f.Err():
				errs[i] = err
			}
		}
		return errs
	})
	return &broker{
		name: "nats", transport: tr, client: client,
		stored: func(ctx context.Context) (int64, error) {
			info, err := s.Info(ctx)
			if err != nil {
				return 0, err
			}
			return int64(info.State.Msgs), nil
		},
		reset: func(ctx context.Context) error { return s.Purge(ctx) },
		close: func() {
			_ = js.DeleteStream(context.Background(), ns)
			nc.Close()
		},
	}, nil
}

// newKafka measures against an in-process kfake cluster of three brokers with one topic of
// three partitions.
func newKafka(_ context.Context, ns string) (*broker, error) {
	name := ns + "." + topic
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, name))
	if err != nil {
		return nil, err
	}
	cl, err := outboxkafka.NewClient(c.ListenAddrs())
	if err != nil {
		c.Close()
		return nil, err
	}
	tr, err := outboxkafka.New(cl, outboxkafka.Options{})
	if err != nil {
		cl.Close()
		c.Close()
		return nil, err
	}
	client := outbox.TransportFunc(func(ctx context.Context, ds []outbox.Delivery) []error {
		errs := make([]error, len(ds))
		records := make([]*kgo.Record, len(ds))
		index := make(map[*kgo.Record]int, len(ds))
		for i, d := range ds {
			records[i] = &kgo.Record{Topic: d.Namespace + "." + d.Topic, Key: []byte(d.PartitionKey), Value: d.Payload, Headers: []kgo.RecordHeader{
				{Key: outboxkafka.HeaderID, Value: []byte(d.ID.String())},
				{Key: outboxkafka.HeaderNamespace, Value: []byte(d.Namespace)},
				{Key: outboxkafka.HeaderTopic, Value: []byte(d.Topic)},
				{Key: outboxkafka.HeaderAttempt, Value: []byte(strconv.Itoa(d.Attempt))},
			}}
			index[records[i]] = i
		}
		for _, res := range cl.ProduceSync(ctx, records...) {
			if res.Err != nil {
				errs[index[res.Record]] = res.Err
			}
		}
		return errs
	})
	total := func() int64 {
		var n int64
		for _, p := range c.PartitionInfos(name) {
			n += p.HighWatermark
		}
		return n
	}
	var base int64
	return &broker{
		name: "kafka", transport: tr, client: client,
		stored: func(context.Context) (int64, error) { return total() - base, nil },
		reset: func(context.Context) error {
			for _, p := range c.PartitionInfos(name) {
				if err := c.DeleteRecords(name, p.Partition, p.HighWatermark); err != nil {
					return fmt.Errorf("delete records: %w", err)
				}
			}
			base = total()
			return nil
		},
		close: func() {
			cl.Close()
			c.Close()
		},
	}, nil
}

// newRedis measures against a stream key of its own, "<ns>:order.paid".
func newRedis(ctx context.Context, addr, ns string) (*broker, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, err
	}
	tr, err := outboxredis.New(rdb, outboxredis.Options{})
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	client := outbox.TransportFunc(func(ctx context.Context, ds []outbox.Delivery) []error {
		errs := make([]error, len(ds))
		cmds := make([]*redis.StringCmd, len(ds))
		pipe := rdb.Pipeline()
		for i, d := range ds {
			cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: d.Namespace + ":" + d.Topic, Values: []any{
				outboxredis.FieldID, d.ID.String(), outboxredis.FieldNamespace, d.Namespace,
				outboxredis.FieldTopic, d.Topic, outboxredis.FieldPartitionKey, d.PartitionKey,
				outboxredis.FieldAttempt, strconv.Itoa(d.Attempt), outboxredis.FieldPayload, string(d.Payload),
			}})
		}
		_, _ = pipe.Exec(ctx)
		for i, cmd := range cmds {
			errs[i] = cmd.Err()
		}
		return errs
	})
	key := ns + ":" + topic
	return &broker{
		name: "redis", transport: tr, client: client,
		stored: func(ctx context.Context) (int64, error) { return rdb.XLen(ctx, key).Result() },
		reset:  func(ctx context.Context) error { return rdb.Del(ctx, key).Err() },
		close: func() {
			_ = rdb.Del(context.Background(), key).Err()
			_ = rdb.Close()
		},
	}, nil
}
