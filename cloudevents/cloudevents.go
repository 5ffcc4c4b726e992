package cloudevents

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxgo/outbox"
)

// Mode chooses how a transport carries an event: [Binary] or [Structured].
type Mode int

const (
	// Binary sends the payload as it is, as the event's data, and the event's
	// attributes as the broker's headers under the names the protocol binding gives them
	// (ce_id on Kafka, ce-id on HTTP and NATS, cloudEvents:id on AMQP). The default.
	Binary Mode = iota

	// Structured sends the whole event as one JSON document (the CloudEvents
	// JSON format, content type [ContentType]) in place of the payload, whose bytes
	// become the event's data. Only the transports whose broker has a CloudEvents
	// binding that defines the structured mode (Kafka, NATS, AMQP, HTTP) accept it.
	Structured
)

// ContentType is the content type of an event in the structured mode.
const ContentType = "application/cloudevents+json; charset=utf-8"

// SpecVersion is the version of the CloudEvents specification that the events
// follow.
const SpecVersion = "1.0"

// Options makes a transport send each message as a CloudEvent (https://cloudevents.io).
// Every transport module takes it as its Options.CloudEvents; nil, the default, sends
// messages as before. The attributes of a message's event:
//
//	id               the message id ([outbox.Delivery.ID]), the same on every retry
//	source           Source
//	specversion      "1.0"
//	type             Type(d), or the topic when Type is nil
//	time             when the message was enqueued ([outbox.Delivery.CreatedAt]), RFC 3339, UTC
//	datacontenttype  the message's "content-type" header, or "application/json"
//	partitionkey     the partition key, when set (the Partitioning extension)
//
// and one extension attribute per other message header whose name, lowercased, is a valid
// CloudEvents attribute name (1 to 20 of a-z and 0-9, such as "traceparent") and is not
// one of the above. A header named "subject" or "dataschema" thus sets that optional
// attribute. A header whose name is not a valid attribute name ("x-request-id") is not
// part of the event: the transport sends it as it sends headers without CloudEvents, under
// its own name, where a CloudEvents consumer ignores it. See [Of].
type Options struct {
	// Source identifies the producer: a URI reference such as "https://shop.example/orders"
	// or "/shop/orders". Required.
	Source string

	// Type returns the event type of a message, such as "com.example.order.created".
	// Default: the message's topic.
	Type func(d outbox.Delivery) string

	// Mode is [Binary] (the default) or [Structured].
	Mode Mode
}

// Validate checks the settings, as the transports' constructors do: Source is a non-empty
// URI reference, Mode one of the two modes. Its errors are [*outbox.ValidationError]s.
func (c *Options) Validate() error {
	if c == nil {
		return nil
	}
	if c.Source == "" {
		return invalid("CloudEvents.Source", "required: a URI reference naming the producer")
	}
	if _, err := url.Parse(c.Source); err != nil || strings.ContainsAny(c.Source, " \t\r\n") {
		return invalid("CloudEvents.Source", "%q is not a URI reference", c.Source)
	}
	if c.Mode != Binary && c.Mode != Structured {
		return invalid("CloudEvents.Mode", "unknown mode %d", c.Mode)
	}
	return nil
}

// Event is the event of one delivery, as [Of] builds it. A transport maps
// Attributes onto its headers with the prefix of its protocol binding and DataContentType
// onto the content type its binding names, or writes the event with [Event.JSON].
type Event struct {
	// Attributes are the context attributes and extensions except datacontenttype: id,
	// source, specversion, type and time (when the delivery has one) first, then the
	// extensions sorted by name. Names are lowercase, without a prefix.
	Attributes []Attribute

	// DataContentType is the message's "content-type" header, or "application/json".
	DataContentType string

	// Other holds the message headers that are not part of the event (their names are not
	// attribute names); nil when there are none. The transport sends them as it sends
	// headers without CloudEvents.
	Other outbox.Headers
}

// Attribute is one attribute of an [Event].
type Attribute struct {
	Name, Value string
}

// ownAttributes are the names the event's attributes take from the delivery and the
// option, never from a message header.
var ownAttributes = []string{"id", "source", "specversion", "type", "time", "datacontenttype", "partitionkey", "data"}

// Of returns the event of d under c. It fails with an error matching [outbox.ErrInvalid]
// when Type returns an empty type; a transport dead-letters such a message.
func Of(c *Options, d outbox.Delivery) (Event, error) {
	typ := d.Topic
	if c.Type != nil {
		typ = c.Type(d)
	}
	if typ == "" {
		return Event{}, fmt.Errorf("%w: CloudEvents type of message %s is empty", outbox.ErrInvalid, d.ID)
	}
	e := Event{DataContentType: "application/json"}
	e.Attributes = append(make([]Attribute, 0, 6+len(d.Headers)),
		Attribute{"id", d.ID.String()},
		Attribute{"source", c.Source},
		Attribute{"specversion", SpecVersion},
		Attribute{"type", typ},
	)
	if !d.CreatedAt.IsZero() {
		e.Attributes = append(e.Attributes, Attribute{"time", d.CreatedAt.UTC().Format(time.RFC3339Nano)})
	}
	ext := make([]Attribute, 0, len(d.Headers)+1)
	if d.PartitionKey != "" {
		ext = append(ext, Attribute{"partitionkey", d.PartitionKey})
	}
	// Sorted, so that of two headers whose names differ only in case the same one wins
	// every time.
	names := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		names = append(names, k)
	}
	slices.Sort(names)
	taken := map[string]bool{}
	for _, k := range names {
		v, name := d.Headers[k], strings.ToLower(k)
		switch {
		case name == "content-type" && !taken[name]:
			e.DataContentType, taken[name] = v, true
		case ValidName(name) && !slices.Contains(ownAttributes, name) && !taken[name]:
			ext, taken[name] = append(ext, Attribute{name, v}), true
		default:
			if e.Other == nil {
				e.Other = outbox.Headers{}
			}
			e.Other[k] = v
		}
	}
	slices.SortFunc(ext, func(a, b Attribute) int { return strings.Compare(a.Name, b.Name) })
	e.Attributes = append(e.Attributes, ext...)
	return e, nil
}

// ValidName reports whether name can be a CloudEvents attribute name: 1 to 20
// lowercase ASCII letters and digits.
func ValidName(name string) bool {
	if name == "" || len(name) > 20 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// Attribute returns the value of the named attribute, and whether the event has it.
func (e Event) Attribute(name string) (string, bool) {
	if name == "datacontenttype" {
		return e.DataContentType, true
	}
	for _, a := range e.Attributes {
		if a.Name == name {
			return a.Value, true
		}
	}
	return "", false
}

// JSON returns the event in the CloudEvents JSON format, with the payload as data, so that
// a consumer's data is the payload byte for byte whatever SDK decodes it:
//
//   - application/json and text/json (parameters aside): the JSON value itself, in data;
//   - any other JSON media type ("+json", such as application/vnd.shop+json): the payload's
//     bytes in data_base64, which the JSON format allows for any data it treats as binary;
//     its data member would have to be the JSON value, which released SDKs that know only
//     application/json and text/json as JSON refuse to decode;
//   - anything else: the payload's text as a JSON string, in data.
func (e Event) JSON(payload []byte) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(len(payload)*4/3 + 256)
	b.WriteByte('{')
	field := func(name string, value []byte) {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		n, _ := json.Marshal(name)
		b.Write(n)
		b.WriteByte(':')
		b.Write(value)
	}
	for _, a := range e.Attributes {
		v, err := json.Marshal(a.Value)
		if err != nil {
			return nil, err
		}
		field(a.Name, v)
	}
	ct, _ := json.Marshal(e.DataContentType)
	field("datacontenttype", ct)
	// utf8.Valid && json.Valid is the check the root package's unexported fast checker
	// makes on Enqueue; only the structured mode pays it here, once per message.
	switch plain, isJSON := jsonMediaType(e.DataContentType); {
	case isJSON && plain && utf8.Valid(payload) && json.Valid(payload):
		field("data", payload)
	case isJSON:
		v := make([]byte, 0, base64.StdEncoding.EncodedLen(len(payload))+2)
		v = append(v, '"')
		v = base64.StdEncoding.AppendEncode(v, payload)
		field("data_base64", append(v, '"'))
	default:
		v, err := json.Marshal(string(payload))
		if err != nil {
			return nil, err
		}
		field("data", v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// CompactMediaType returns a content type without the optional whitespace around the
// semicolons and equals signs of its parameters ("text/plain; charset=utf-8" becomes
// "text/plain;charset=utf-8"), the same media type to any parser. A header value that
// needs no percent-encoding then reaches consumers whose binding does not decode it
// unchanged. Quoted parameter values are kept as they are.
func CompactMediaType(ct string) string {
	if !strings.ContainsAny(ct, " \t") {
		return ct
	}
	var b strings.Builder
	b.Grow(len(ct))
	quoted := false
	for i := 0; i < len(ct); i++ {
		c := ct[i]
		switch {
		case quoted:
			if c == '\\' && i+1 < len(ct) {
				b.WriteByte(c)
				i++
				c = ct[i]
			} else if c == '"' {
				quoted = false
			}
		case c == '"':
			quoted = true
		case c == ' ' || c == '\t':
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// PercentEncode encodes an attribute value for a header, as the HTTP and NATS protocol
// bindings require of their ce- headers: space, double quote, percent and every byte outside
// printable ASCII become %XX (upper-case hex) of the value's UTF-8 bytes; everything else is
// kept. "100% sure" becomes "100%25%20sure".
func PercentEncode(v string) string {
	n := 0
	for i := 0; i < len(v); i++ {
		if mustEncode(v[i]) {
			n++
		}
	}
	if n == 0 {
		return v
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(v)+2*n)
	for i := 0; i < len(v); i++ {
		if c := v[i]; mustEncode(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

func mustEncode(c byte) bool { return c <= ' ' || c >= 0x7f || c == '"' || c == '%' }

// invalid returns the error of a bad setting, as the root package reports its own.
func invalid(field, format string, args ...any) *outbox.ValidationError {
	return &outbox.ValidationError{Index: -1, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// jsonMediaType reports whether a content type declares JSON data, as the CloudEvents JSON
// format defines it (*/json or */*+json), and whether it is one of the two types that every
// SDK reads as JSON (application/json, text/json).
func jsonMediaType(ct string) (plain, isJSON bool) {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false, false
	}
	if mt == "application/json" || mt == "text/json" {
		return true, true
	}
	_, sub, _ := strings.Cut(mt, "/")
	return false, sub == "json" || strings.HasSuffix(sub, "+json")
}
