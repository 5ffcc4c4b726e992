module github.com/outboxgo/outbox/transport/amqp

go 1.26.0

require github.com/outboxgo/outbox v0.0.0

replace github.com/outboxgo/outbox => ../..
