module github.com/outboxgo/outbox/transport/webhook

go 1.26.0

require (
	github.com/outboxgo/outbox v0.0.0
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/google/uuid v1.6.0
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)

replace github.com/outboxgo/outbox => ../..
