package outboxamqp

import (
	"fmt"
	"log/slog"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
)

// Defaults of [Options].
const (
	DefaultURL            = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultDialTimeout    = 10 * time.Second
	DefaultConfirmTimeout = 30 * time.Second
	DefaultReconnectMin   = 100 * time.Millisecond
	DefaultReconnectMax   = 10 * time.Second
	// DefaultContentType is the content type of a message without a "content-type" header:
	// outbox payloads are JSON.
	DefaultContentType = "application/json"
)

// Options configure a [Transport]. Zero fields take the documented defaults; [New] refuses
// inconsistent settings with an error matching [outbox.ErrInvalid].
type Options struct {
	// URL is the broker's AMQP URI (amqp:// or amqps://, with credentials and vhost).
	// Default [DefaultURL].
	URL string

	// Config is passed to amqp091.DialConfig: TLS, SASL, heartbeat, vhost, connection
	// properties. Its Dial field must be nil: the transport dials itself, to bound the dial
	// by DialTimeout and by the context of the Publish that dials. Default: the library's
	// defaults (10 s heartbeat).
	Config amqp091.Config

	// Route returns the exchange and routing key of a message. An error fails that message
	// as it is (wrap it with [outbox.Permanent] to dead-letter it). Default [DefaultRoute]:
	// the namespace's exchange, the topic as routing key.
	Route func(d *outbox.Delivery) (exchange, routingKey string, err error)

	// Transient publishes messages with the transient delivery mode, which a broker may
	// lose on restart. Default false: persistent.
	Transient bool

	// PermanentUnroutable dead-letters at once a message the broker returned as unroutable
	// or whose exchange does not exist. Default false: such messages are retried under the
	// publisher's retry policy (see the package documentation for why).
	PermanentUnroutable bool

	// DialTimeout bounds one dial, TCP and AMQP handshake together. Default
	// [DefaultDialTimeout].
	DialTimeout time.Duration

	// ConfirmTimeout bounds one Publish call from the first message sent to the last
	// confirmation. Messages not confirmed by then fail (they are retried) and the
	// connection is closed, since its state is unknown. Default [DefaultConfirmTimeout].
	ConfirmTimeout time.Duration

	// ReconnectMin and ReconnectMax bound the pause after a failed dial during which
	// Publish fails at once instead of dialling: it starts at ReconnectMin, doubles after
	// each failed dial up to ReconnectMax, and resets after a successful one. Defaults
	// [DefaultReconnectMin] and [DefaultReconnectMax].
	ReconnectMin time.Duration
	ReconnectMax time.Duration

	// Logger receives one warning when the connection is lost (or the first dial fails),
	// and one line when a connection is back; the dial failures in between are logged at
	// the debug level. Default [slog.Default].
	Logger *slog.Logger

	// CloudEvents, when set, sends every message as a CloudEvent under the AMQP protocol
	// binding: in the binary mode, the attributes as headers named "cloudEvents:" and the
	// attribute's name (cloudEvents:id, cloudEvents:source, cloudEvents:specversion,
	// cloudEvents:type, cloudEvents:time, cloudEvents:partitionkey, one per extension) and
	// datacontenttype as the content-type property, the payload as the body; in the
	// structured mode, the event as JSON in the body with content-type
	// application/cloudevents+json. The message-id, type, timestamp and outbox-* headers
	// are set as before. Default nil: no CloudEvents.
	CloudEvents *cloudevents.Options
}

// DefaultRoute routes a message to the exchange named after its namespace with its topic
// as routing key.
func DefaultRoute(d *outbox.Delivery) (exchange, routingKey string, err error) {
	return d.Namespace, d.Topic, nil
}

func invalid(field, format string, args ...any) error {
	return &outbox.ValidationError{Index: -1, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// validate applies the defaults and checks the settings.
func (o *Options) validate() error {
	if o.URL == "" {
		o.URL = DefaultURL
	}
	if _, err := amqp091.ParseURI(o.URL); err != nil {
		// The error may quote the URI, password included: say only what is wrong.
		return invalid("URL", "not an AMQP URI (amqp://user:password@host:port/vhost)")
	}
	if o.Config.Dial != nil {
		return invalid("Config", "Dial must be nil: the transport dials itself")
	}
	if o.Route == nil {
		o.Route = DefaultRoute
	}
	var err error
	set := func(field string, v *time.Duration, def time.Duration) {
		switch {
		case err != nil:
		case *v == 0:
			*v = def
		case *v < 0:
			err = invalid(field, "must be positive, got %s", *v)
		}
	}
	set("DialTimeout", &o.DialTimeout, DefaultDialTimeout)
	set("ConfirmTimeout", &o.ConfirmTimeout, DefaultConfirmTimeout)
	set("ReconnectMin", &o.ReconnectMin, DefaultReconnectMin)
	set("ReconnectMax", &o.ReconnectMax, max(DefaultReconnectMax, o.ReconnectMin))
	if err != nil {
		return err
	}
	if o.ReconnectMax < o.ReconnectMin {
		return invalid("ReconnectMax", "must be at least ReconnectMin (%s), got %s", o.ReconnectMin, o.ReconnectMax)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o.CloudEvents.Validate()
}
