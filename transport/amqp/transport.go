package outboxamqp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
)

// Errors reported for single messages. Match them with [errors.Is].
var (
	// ErrUnroutable: the broker returned the message because no binding of its exchange
	// matched its routing key. The error also carries the broker's reply code and text.
	ErrUnroutable = errors.New("amqp: message returned unroutable")

	// ErrNoExchange: the message's exchange does not exist on the broker.
	ErrNoExchange = errors.New("amqp: exchange does not exist")

	// ErrNacked: the broker refused the message with a negative acknowledgement (an
	// internal error, or a queue at its length limit with overflow reject-publish).
	ErrNacked = errors.New("amqp: message nacked by the broker")

	// ErrNotConnected: no connection to the broker, and the pause after a failed dial has
	// not passed yet. The error says when the next dial may happen. It matches
	// [net.ErrClosed], so that [outbox.IsUnreachable] takes it for a broker that did not
	// answer, which never spends an attempt.
	ErrNotConnected error = connError("amqp: not connected to the broker")

	// ErrConnectionLost: the connection or channel closed before the message was
	// confirmed. The broker may have taken the message: its retry may be a duplicate. It
	// matches [net.ErrClosed] too.
	ErrConnectionLost error = connError("amqp: connection lost before confirmation")

	// ErrClosed: the transport was closed with [Transport.Close].
	ErrClosed = errors.New("amqp: transport closed")
)

// Transport publishes outbox messages to an AMQP 0-9-1 broker. It is safe for concurrent
// use: overlapping Publish calls share the connection and its channel. Build one with [New]
// and release it with [Transport.Close].
type Transport struct {
	opts Options
	// host and port are the broker's, from opts.URL, for Destination.
	host string
	port int

	mu       sync.Mutex
	sess     *session
	dialing  chan struct{} // closed when the dial in progress ends; nil when none
	nextDial time.Time
	backoff  time.Duration
	closed   bool
	down     bool // a connection was lost, or a dial failed, and none is back yet
}

var (
	_ outbox.Transport         = (*Transport)(nil)
	_ outbox.TransportKeyOrder = (*Transport)(nil)
)

// New returns a Transport with opts, checked and completed with their defaults. It does not
// dial: the first Publish does.
func New(opts Options) (*Transport, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	t := &Transport{opts: opts, backoff: opts.ReconnectMin}
	if uri, err := amqp091.ParseURI(opts.URL); err == nil { // validate parsed it
		t.host, t.port = uri.Host, uri.Port
	}
	return t, nil
}

// Close closes the connection, if any. Publish calls after Close fail with [ErrClosed].
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	s := t.sess
	t.sess = nil
	t.mu.Unlock()
	if s != nil {
		return s.close(true)
	}
	return nil
}

// System returns "rabbitmq", the messaging.system of OpenTelemetry's conventions, for telemetry
// ([outbox.TransportSystem]).
func (t *Transport) System() string { return "rabbitmq" }

// Destination reports the exchange and routing key of d and the broker's host and port
// from [Options.URL], for telemetry ([outbox.TransportDestination]). A message whose Route
// fails has no destination name.
func (t *Transport) Destination(d outbox.Delivery) outbox.Destination {
	dst := outbox.Destination{ServerAddress: t.host, ServerPort: t.port}
	if exchange, key, err := t.opts.Route(&d); err == nil {
		dst.Name, dst.RoutingKey = exchange, key
	}
	return dst
}

// Publish publishes the batch with the mandatory flag and awaits every confirmation. See
// [outbox.Transport] for the contract and the package documentation for the errors.
// Messages that share a namespace and a partition key go one after another, each once the
// one ahead of it was confirmed and not returned, so that no queue gets one whose
// predecessor was refused or unroutable; different keys, and messages without a key, still
// go together ([Transport.KeepsKeyOrder]).
func (t *Transport) Publish(ctx context.Context, batch []outbox.Delivery) []error {
	ctx, cancel := context.WithTimeout(ctx, t.opts.ConfirmTimeout)
	defer cancel()
	return outbox.PublishInKeyOrder(ctx, batch, nil, t.publish)
}

// KeepsKeyOrder reports true: Publish keeps the order of a partition key's messages inside
// a batch ([outbox.TransportKeyOrder]).
func (t *Transport) KeepsKeyOrder() bool { return true }

// publish publishes batch and awaits every confirmation.
func (t *Transport) publish(ctx context.Context, batch []outbox.Delivery) []error {
	if len(batch) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, t.opts.ConfirmTimeout)
	defer cancel()
	errs := make([]error, len(batch))
	s, err := t.session(ctx)
	if err != nil {
		err = Classify(err)
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	// When ctx ends, close the connection under the calls still writing or waiting: the
	// client's writes do not watch a context, and the confirmations still owed are lost.
	stop := context.AfterFunc(ctx, func() { t.drop(s, ctx.Err()) })
	defer stop()

	pending := make([]*amqp091.DeferredConfirmation, len(batch))
	for i := range batch {
		d := &batch[i]
		exchange, key, err := t.opts.Route(d)
		if err != nil {
			errs[i] = err
			continue
		}
		if err := s.checkExchange(exchange); err != nil {
			if errors.Is(err, ErrNoExchange) {
				errs[i] = t.unroutable(err)
				continue
			}
			t.drop(s, err)
			failRest(errs, i, lost(err))
			break
		}
		pub, err := t.publishing(d)
		if err != nil {
			errs[i] = outbox.Permanent(err)
			continue
		}
		dc, err := s.ch.PublishWithDeferredConfirm(exchange, key, true, false, pub)
		if err != nil {
			// The publishing is always well formed (string headers), so an error is the
			// connection's: a write failed or the channel closed.
			t.drop(s, err)
			failRest(errs, i, lost(err))
			break
		}
		pending[i] = dc
	}

	var acked []string
	for i, dc := range pending {
		if dc == nil {
			continue
		}
		select {
		case <-dc.Done():
		case <-ctx.Done():
			t.drop(s, ctx.Err())
			errs[i] = lost(ctx.Err())
			continue
		}
		switch {
		case dc.Acked():
			acked = append(acked, batch[i].ID.String())
		case s.broken(): // the client nacks what is pending when the connection closes
			errs[i] = lost(s.cause())
		default:
			errs[i] = ErrNacked
		}
	}
	if len(acked) == 0 {
		return errs
	}
	returned, err := s.returned(acked)
	if err != nil {
		// The returns of confirmed messages cannot be told any more: fail them, at the risk
		// of a duplicate rather than a loss.
		for i := range batch {
			if pending[i] != nil && errs[i] == nil {
				errs[i] = lost(err)
			}
		}
		return errs
	}
	for i := range batch {
		if r, ok := returned[batch[i].ID.String()]; ok && pending[i] != nil && errs[i] == nil {
			errs[i] = t.unroutable(fmt.Errorf("%w: exchange %q, routing key %q: %d %s",
				ErrUnroutable, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText))
		}
	}
	return errs
}

// unroutable applies [Options.PermanentUnroutable].
func (t *Transport) unroutable(err error) error {
	if t.opts.PermanentUnroutable {
		return outbox.Permanent(err)
	}
	return err
}

// lost is the outcome of a message whose connection or channel went away before its
// confirmation: an outage, unless the publish was cancelled.
func lost(cause error) error {
	if cause == nil || errors.Is(cause, ErrConnectionLost) {
		return Classify(ErrConnectionLost)
	}
	return Classify(fmt.Errorf("%w: %w", ErrConnectionLost, cause))
}

// Classify reports how the transport treats an error: wrapped with [outbox.Unavailable]
// when the broker cannot be reached ([ErrNotConnected], [ErrConnectionLost], a closed
// connection or channel, a network error, a connection closed by the broker with
// CONNECTION_FORCED, RESOURCE_ERROR or INTERNAL_ERROR), returned as it is otherwise:
// [ErrNacked], [ErrUnroutable], [ErrNoExchange], [ErrClosed] and a channel the broker
// closed over a publish (a soft AMQP error, even after [ErrConnectionLost]) are retried (or
// dead-lettered, with [Options.PermanentUnroutable]). A cancelled publish is never an
// outage. Publish applies it to every failure; it is exported for transports that wrap
// this one.
func Classify(err error) error {
	if err == nil || outbox.IsPermanent(err) || outbox.IsUnavailable(err) || errors.Is(err, context.Canceled) {
		return err
	}
	if errors.Is(err, ErrNotConnected) {
		return outbox.Unavailable(err)
	}
	var aerr *amqp091.Error
	if errors.As(err, &aerr) && aerr.Server && aerr.Recover {
		// A channel exception on a live connection (403 ACCESS_REFUSED, 404 NOT_FOUND, 406
		// PRECONDITION_FAILED for a message above max_message_size): the broker refused a
		// publish, it is not down. Marked Unavailable, the message at fault would never
		// spend an attempt and would hold the circuit breaker open for ever.
		return err
	}
	if errors.Is(err, ErrConnectionLost) || errors.Is(err, amqp091.ErrClosed) || outbox.IsUnreachable(err) {
		return outbox.Unavailable(err)
	}
	if aerr != nil {
		switch aerr.Code {
		case amqp091.ConnectionForced, amqp091.ResourceError, amqp091.InternalError:
			return outbox.Unavailable(err)
		}
	}
	return err
}

// failRest fails every message from index i on that has no outcome yet.
func failRest(errs []error, i int, err error) {
	for ; i < len(errs); i++ {
		if errs[i] == nil {
			errs[i] = err
		}
	}
}

// Header keys the transport sets on every message.
const (
	HeaderNamespace    = "outbox-namespace"
	HeaderTopic        = "outbox-topic"
	HeaderAttempt      = "outbox-attempt"
	HeaderPartitionKey = "outbox-partition-key"
	HeaderTenantID     = "outbox-tenant-id"
	HeaderDedupeKey    = "outbox-dedupe-key"
)

// CloudEventsPrefix starts the header names of a CloudEvent's attributes in the binary
// mode, as the AMQP protocol binding of CloudEvents names its application properties;
// datacontenttype is the content-type property.
const CloudEventsPrefix = "cloudEvents:"

// maxShortString is the longest AMQP short string: a header name, the content type. The
// client cannot encode a longer one, and fails the whole connection trying.
const maxShortString = 255

func (t *Transport) publishing(d *outbox.Delivery) (amqp091.Publishing, error) {
	h := make(amqp091.Table, len(d.Headers)+16)
	contentType := DefaultContentType
	own, body := d.Headers, []byte(d.Payload)
	if ce := t.opts.CloudEvents; ce != nil {
		e, err := cloudevents.Of(ce, *d)
		if err != nil {
			return amqp091.Publishing{}, err
		}
		own, contentType = e.Other, e.DataContentType
		if ce.Mode == cloudevents.Structured {
			if body, err = e.JSON(d.Payload); err != nil {
				return amqp091.Publishing{}, fmt.Errorf("amqp: CloudEvent of message %s: %w", d.ID, err)
			}
			contentType = cloudevents.ContentType
		} else {
			for _, a := range e.Attributes {
				h[CloudEventsPrefix+a.Name] = a.Value
			}
		}
		for k := range own {
			if lk := strings.ToLower(k); strings.HasPrefix(lk, "cloudevents:") || strings.HasPrefix(lk, "cloudevents_") {
				return amqp091.Publishing{}, fmt.Errorf("amqp: header %q of message %s would replace a CloudEvents attribute", k, d.ID)
			}
		}
	}
	for k, v := range own {
		if len(k) > maxShortString {
			return amqp091.Publishing{}, fmt.Errorf("amqp: header name %.40q… of message %s is longer than AMQP's %d bytes", k, d.ID, maxShortString)
		}
		h[k] = v
		if strings.EqualFold(k, "content-type") && t.opts.CloudEvents == nil {
			contentType = v
		}
	}
	if len(contentType) > maxShortString {
		return amqp091.Publishing{}, fmt.Errorf("amqp: content type %.40q… of message %s is longer than AMQP's %d bytes", contentType, d.ID, maxShortString)
	}
	h[HeaderNamespace] = d.Namespace
	h[HeaderTopic] = d.Topic
	h[HeaderAttempt] = int64(d.Attempt)
	if d.PartitionKey != "" {
		h[HeaderPartitionKey] = d.PartitionKey
	}
	if d.TenantID != [16]byte{} {
		h[HeaderTenantID] = d.TenantID.String()
	}
	if d.DedupeKey != "" {
		h[HeaderDedupeKey] = d.DedupeKey
	}
	mode := amqp091.Persistent
	if t.opts.Transient {
		mode = amqp091.Transient
	}
	return amqp091.Publishing{
		Headers:      h,
		ContentType:  contentType,
		DeliveryMode: mode,
		MessageId:    d.ID.String(),
		Timestamp:    d.CreatedAt,
		Type:         d.Topic,
		Body:         body,
	}, nil
}

// session returns the live session, dialling one when there is none and the backoff allows.
func (t *Transport) session(ctx context.Context) (*session, error) {
	t.mu.Lock()
	for {
		if t.closed {
			t.mu.Unlock()
			return nil, ErrClosed
		}
		if s := t.sess; s != nil {
			if !s.broken() {
				t.mu.Unlock()
				return s, nil
			}
			t.sess = nil
			t.lostLocked(s.cause())
			_ = s.close(false) // the connection is gone: this only releases what is left
			continue
		}
		if t.dialing != nil {
			wait := t.dialing
			t.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: %w", ErrNotConnected, ctx.Err())
			}
			t.mu.Lock()
			continue
		}
		if now := time.Now(); now.Before(t.nextDial) {
			t.mu.Unlock()
			return nil, fmt.Errorf("%w (next dial in %s)", ErrNotConnected, t.nextDial.Sub(now).Round(time.Millisecond))
		}
		done := make(chan struct{})
		t.dialing = done
		t.mu.Unlock()

		s, err := t.dial(ctx)

		t.mu.Lock()
		t.dialing = nil
		close(done)
		if err != nil {
			t.nextDial = time.Now().Add(t.backoff)
			t.lostLocked(err)
			t.opts.Logger.Debug("outbox amqp: dial failed", "err", err, "retry_in", t.backoff)
			t.backoff = min(2*t.backoff, t.opts.ReconnectMax)
			t.mu.Unlock()
			return nil, fmt.Errorf("%w: %w", ErrNotConnected, err)
		}
		if t.closed {
			t.mu.Unlock()
			_ = s.close(true)
			return nil, ErrClosed
		}
		t.backoff = t.opts.ReconnectMin
		t.nextDial = time.Time{}
		t.sess = s
		if t.down {
			t.down = false
			t.opts.Logger.Info("outbox amqp: connected to the broker again")
		}
		t.mu.Unlock()
		return s, nil
	}
}

// drop forgets s, when it is still the current session, and closes its connection at once.
func (t *Transport) drop(s *session, cause error) {
	first := s.markDropped(cause)
	t.mu.Lock()
	if t.sess == s {
		t.sess = nil
	}
	if first && !errors.Is(cause, context.Canceled) {
		t.lostLocked(cause)
	}
	t.mu.Unlock()
	_ = s.close(false)
}

// lostLocked logs, once until a connection is back, that the broker cannot be reached;
// t.mu is held.
func (t *Transport) lostLocked(cause error) {
	if !t.down && !t.closed {
		t.down = true
		t.opts.Logger.Warn("outbox amqp: connection to the broker lost; batches fail Unavailable until it is back", "err", cause)
	}
}

// dial connects, opens a channel in confirm mode and starts the session's returns loop.
// ctx bounds the whole of it, handshake included.
func (t *Transport) dial(ctx context.Context) (*session, error) {
	ctx, cancel := context.WithTimeout(ctx, t.opts.DialTimeout)
	defer cancel()
	var raw net.Conn
	var rawMu sync.Mutex
	cfg := t.opts.Config
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		rawMu.Lock()
		raw = c
		rawMu.Unlock()
		return c, nil
	}
	if cfg.Properties == nil {
		cfg.Properties = amqp091.Table{"connection_name": "outbox"}
	}
	// Close the socket under a handshake, or a channel opening, that outlives ctx.
	stop := context.AfterFunc(ctx, func() {
		rawMu.Lock()
		defer rawMu.Unlock()
		if raw != nil {
			_ = raw.Close()
		}
	})
	conn, err := amqp091.DialConfig(t.opts.URL, cfg)
	var ch *amqp091.Channel
	what := "dial"
	if err == nil {
		what = "open channel"
		if ch, err = conn.Channel(); err == nil {
			what = "confirm mode"
			err = ch.Confirm(false)
		}
	}
	if !stop() || err != nil {
		if raw != nil {
			_ = raw.Close()
		}
		switch {
		case err == nil:
			err = ctx.Err()
		case ctx.Err() != nil && !errors.Is(err, ctx.Err()):
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, fmt.Errorf("amqp: %s: %w", what, err)
	}
	s := &session{
		conn: conn, raw: raw, ch: ch,
		returns: make(chan amqp091.Return, 256),
		queries: make(chan returnQuery),
		quit:    make(chan struct{}),
		exited:  make(chan struct{}),
		known:   map[string]bool{"": true},
	}
	s.ch.NotifyReturn(s.returns)
	s.closes = s.ch.NotifyClose(make(chan *amqp091.Error, 1))
	go s.returnsLoop()
	return s, nil
}

// session is one connection with its publishing channel.
type session struct {
	conn *amqp091.Connection
	raw  net.Conn
	ch   *amqp091.Channel

	// returns receives the broker's basic.return frames. The client sends a return before
	// it handles the confirmation of the same message, and returnsLoop alone reads it and
	// answers queries, so a query made after a confirmation sees that message's return.
	returns chan amqp091.Return
	queries chan returnQuery
	quit    chan struct{} // closed by close: returnsLoop ends
	exited  chan struct{} // closed when returnsLoop has ended

	// chkMu serializes the exchange checks. It is held across a broker round trip, so it
	// must never be the mutex that drop needs to close the connection under that trip.
	chkMu sync.Mutex
	chk   *amqp091.Channel // for passive exchange declarations, which close it on 404
	known map[string]bool  // exchanges seen to exist on this connection

	// closes receives the error the broker closed the channel (or its connection) with.
	closes chan *amqp091.Error

	mu        sync.Mutex
	dropped   bool
	dropCause error
	closeErr  *amqp091.Error // read from closes
	closeOnce sync.Once
}

type returnQuery struct {
	ids   []string
	reply chan map[string]amqp091.Return
}

// returnsLoop records the returns and answers queries until the session is closed.
func (s *session) returnsLoop() {
	defer close(s.exited)
	got := map[string]amqp091.Return{}
	record := func(r amqp091.Return) { got[r.MessageId] = r }
	returns := s.returns
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil // the channel closed: keep answering from what was recorded
				continue
			}
			record(r)
		case q := <-s.queries:
			// Take the returns already queued: they were sent before the confirmations
			// that preceded this query.
		drain:
			for returns != nil {
				select {
				case r, ok := <-returns:
					if !ok {
						returns = nil
						break drain
					}
					record(r)
				default:
					break drain
				}
			}
			ans := map[string]amqp091.Return{}
			for _, id := range q.ids {
				if r, ok := got[id]; ok {
					ans[id] = r
					delete(got, id)
				}
			}
			q.reply <- ans
		case <-s.quit:
			return
		}
	}
}

// returned reports which of the confirmed messages ids the broker returned.
func (s *session) returned(ids []string) (map[string]amqp091.Return, error) {
	q := returnQuery{ids: ids, reply: make(chan map[string]amqp091.Return, 1)}
	select {
	case s.queries <- q:
		return <-q.reply, nil
	case <-s.quit:
		return nil, s.cause()
	}
}

// checkExchange reports [ErrNoExchange] when exchange does not exist, with a passive
// declaration on a channel of its own, once per exchange and connection.
func (s *session) checkExchange(exchange string) error {
	s.chkMu.Lock()
	defer s.chkMu.Unlock()
	if s.known[exchange] {
		return nil
	}
	if s.chk == nil || s.chk.IsClosed() {
		ch, err := s.conn.Channel()
		if err != nil {
			return err
		}
		s.chk = ch
	}
	err := s.chk.ExchangeDeclarePassive(exchange, "direct", false, false, false, false, nil)
	var aerr *amqp091.Error
	switch {
	case err == nil:
		s.known[exchange] = true
		return nil
	case errors.As(err, &aerr) && aerr.Code == amqp091.NotFound:
		s.chk = nil // the broker closed it
		return fmt.Errorf("%w: %q", ErrNoExchange, exchange)
	}
	return err
}

func (s *session) broken() bool {
	return s.isDropped() || s.conn.IsClosed() || s.ch.IsClosed()
}

func (s *session) markDropped(cause error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dropped {
		return false
	}
	s.dropped, s.dropCause = true, cause
	return true
}

func (s *session) isDropped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

func (s *session) cause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dropCause != nil {
		return s.dropCause
	}
	if s.closeErr == nil {
		select {
		case e := <-s.closes:
			s.closeErr = e
		default:
		}
	}
	if s.closeErr != nil {
		return s.closeErr
	}
	return ErrConnectionLost
}

// close ends the session: gracefully (a connection.close handshake bounded to a second)
// or at once, closing the socket. It waits for returnsLoop to end.
func (s *session) close(graceful bool) error {
	var err error
	s.closeOnce.Do(func() {
		s.markDropped(ErrClosed)
		if graceful {
			err = s.conn.CloseDeadline(time.Now().Add(time.Second))
			if errors.Is(err, amqp091.ErrClosed) {
				err = nil
			}
		}
		_ = s.raw.Close()
		close(s.quit)
		<-s.exited
	})
	return err
}

// connError is an error of a connection that is gone: it matches [net.ErrClosed].
type connError string

func (e connError) Error() string { return string(e) }

func (e connError) Is(target error) bool { return target == net.ErrClosed }
