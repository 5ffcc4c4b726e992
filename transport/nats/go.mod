module github.com/outboxgo/outbox/transport/nats

go 1.26.0

replace github.com/outboxgo/outbox => ../..
