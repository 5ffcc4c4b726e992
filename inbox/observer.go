package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
)

// Message describes the broker message a delivery came in, for an [Observer]: what
// [Inbox.Process] does not otherwise know. Attach it to the context passed to Process with
// [WithMessage].
type Message struct {
	// Destination is where the message was received from: a subject, topic, queue or
	// stream name. Empty when unknown.
	Destination string
	// Headers are the broker message's headers, such as the trace context the producer
	// stored with the message ("traceparent", "tracestate"). Read only.
	Headers map[string]string
}

type messageKey struct{}

// WithMessage returns a copy of ctx that carries m to the [Observer] of [Inbox.Process].
// Without an observer it changes nothing.
func WithMessage(ctx context.Context, m Message) context.Context {
	return context.WithValue(ctx, messageKey{}, m)
}

// MessageFrom returns the [Message] attached to ctx with [WithMessage], if any.
func MessageFrom(ctx context.Context) (Message, bool) {
	m, ok := ctx.Value(messageKey{}).(Message)
	return m, ok
}

// Delivery is one call of [Inbox.Process], as an [Observer] sees it.
type Delivery struct {
	Group, MessageID string
	// Message is what the caller attached with [WithMessage]; zero when nothing was.
	Message
}

// Observer watches [Inbox.Process], set in [Options.Observer], for telemetry: StartProcess
// is called after the arguments are checked and before the transaction begins, and the
// context it returns is the one the handler receives, so the handler's spans are children
// of the observer's; EndProcess is called when Process returns, with its result and error.
// It must be safe for concurrent use. A panic in either method is recovered and logged
// with [slog.Default]; Process then goes on as without an observer.
type Observer interface {
	StartProcess(ctx context.Context, d Delivery) context.Context
	EndProcess(ctx context.Context, d Delivery, res Result, err error)
}

func (in *Inbox) startProcess(ctx context.Context, d Delivery) (out context.Context, ok bool) {
	out = ctx
	defer func() {
		if v := recover(); v != nil {
			observerPanicked("StartProcess", v)
			out, ok = ctx, false
		}
	}()
	if c := in.obs.StartProcess(ctx, d); c != nil {
		out = c
	}
	return out, true
}

func (in *Inbox) endProcess(ctx context.Context, d Delivery, res Result, err error) {
	defer func() {
		if v := recover(); v != nil {
			observerPanicked("EndProcess", v)
		}
	}()
	in.obs.EndProcess(ctx, d, res, err)
}

func observerPanicked(what string, v any) {
	slog.Default().Error("inbox: observer panicked; carrying on without it", "hook", "Observer."+what,
		"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
}
