package outbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/url"
	"slices"
	"strings"
	"time"
)

// CloudEventsMode chooses how a transport carries a CloudEvent: [CloudEventsBinary] or
// [CloudEventsStructured].
type CloudEventsMode int

const (
	// CloudEventsBinary sends the payload as it is, as the event's data, and the event's
	// attributes as the broker's headers under the names the protocol binding gives them
	// (ce_id on Kafka, ce-id on HTTP and NATS, cloudEvents:id on AMQP). The default.
	CloudEventsBinary CloudEventsMode = iota

	// CloudEventsStructured sends the whole event as one JSON document (the CloudEvents
	// JSON format, content type [CloudEventsJSON]) in place of the payload, whose bytes
	// become the event's data. Only the transports whose broker has a CloudEvents
	// binding that defines the structured mode (Kafka, NATS, AMQP, HTTP) accept it.
	CloudEventsStructured
)

// CloudEventsJSON is the content type of an event in the structured mode.
const CloudEventsJSON = "application/cloudevents+json; charset=utf-8"

// CloudEventsSpecVersion is the version of the CloudEvents specification that the events
// follow.
const CloudEventsSpecVersion = "1.0"

// CloudEvents makes a transport send each message as a CloudEvent (https://cloudevents.io).
// Every transport module takes it as its Options.CloudEvents; nil, the default, sends
// messages as before. The attributes of a message's event:
//
//	id               the message id ([Delivery.ID]), the same on every retry
//	source           Source
//	specversion      "1.0"
//	type             Type(d), or the topic when Type is nil
//	time             when the message was enqueued ([Delivery.CreatedAt]), RFC 3339, UTC
//	datacontenttype  the message's "content-type" header, or "application/json"
//	partitionkey     the partition key, when set (the Partitioning extension)
//
// and one extension attribute per other message header whose name, lowercased, is a valid
// CloudEvents attribute name (1 to 20 of a-z and 0-9, such as "traceparent") and is not
// one of the above. A header named "subject" or "dataschema" thus sets that optional
// attribute. A header whose name is not a valid attribute name ("x-request-id") is not
// part of the event: the transport sends it as it sends headers without CloudEvents, under
// its own name, where a CloudEvents consumer ignores it. See [CloudEventOf].
type CloudEvents struct {
	// Source identifies the producer: a URI reference such as "https://shop.example/orders"
	// or "/shop/orders". Required.
	Source string

	// Type returns the event type of a message, such as "com.example.order.created".
	// Default: the message's topic.
	Type func(d Delivery) string

	// Mode is [CloudEventsBinary] (the default) or [CloudEventsStructured].
	Mode CloudEventsMode
}

// Validate checks the settings, as the transports' constructors do: Source is a non-empty
// URI reference, Mode one of the two modes. Its errors are [*ValidationError]s.
func (c *CloudEvents) Validate() error {
	if c == nil {
		return nil
	}
	if c.Source == "" {
		return invalid("CloudEvents.Source", "required: a URI reference naming the producer")
	}
	if _, err := url.Parse(c.Source); err != nil || strings.ContainsAny(c.Source, " \t\r\n") {
		return invalid("CloudEvents.Source", "%q is not a URI reference", c.Source)
	}
	if c.Mode != CloudEventsBinary && c.Mode != CloudEventsStructured {
		return invalid("CloudEvents.Mode", "unknown mode %d", c.Mode)
	}
	return nil
}

// CloudEvent is the event of one delivery, as [CloudEventOf] builds it. A transport maps
// Attributes onto its headers with the prefix of its protocol binding and DataContentType
// onto the content type its binding names, or writes the event with [CloudEvent.JSON].
type CloudEvent struct {
	// Attributes are the context attributes and extensions except datacontenttype: id,
	// source, specversion, type and time (when the delivery has one) first, then the
	// extensions sorted by name. Names are lowercase, without a prefix.
	Attributes []CloudEventAttribute

	// DataContentType is the message's "content-type" header, or "application/json".
	DataContentType string

	// Other holds the message headers that are not part of the event (their names are not
	// attribute names); nil when there are none. The transport sends them as it sends
	// headers without CloudEvents.
	Other Headers
}

// CloudEventAttribute is one attribute of a [CloudEvent].
type CloudEventAttribute struct {
	Name, Value string
}

// ownAttributes are the names the event's attributes take from the delivery and the
// option, never from a message header.
var ownAttributes = []string{"id", "source", "specversion", "type", "time", "datacontenttype", "partitionkey", "data"}

// CloudEventOf returns the event of d under c. It fails with an error matching [ErrInvalid]
// when Type returns an empty type; a transport dead-letters such a message.
func CloudEventOf(c *CloudEvents, d Delivery) (CloudEvent, error) {
	typ := d.Topic
	if c.Type != nil {
		typ = c.Type(d)
	}
	if typ == "" {
		return CloudEvent{}, fmt.Errorf("%w: CloudEvents type of message %s is empty", ErrInvalid, d.ID)
	}
	e := CloudEvent{DataContentType: "application/json"}
	e.Attributes = append(make([]CloudEventAttribute, 0, 6+len(d.Headers)),
		CloudEventAttribute{"id", d.ID.String()},
		CloudEventAttribute{"source", c.Source},
		CloudEventAttribute{"specversion", CloudEventsSpecVersion},
		CloudEventAttribute{"type", typ},
	)
	if !d.CreatedAt.IsZero() {
		e.Attributes = append(e.Attributes, CloudEventAttribute{"time", d.CreatedAt.UTC().Format(time.RFC3339Nano)})
	}
	ext := make([]CloudEventAttribute, 0, len(d.Headers)+1)
	if d.PartitionKey != "" {
		ext = append(ext, CloudEventAttribute{"partitionkey", d.PartitionKey})
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
		case ValidCloudEventsName(name) && !slices.Contains(ownAttributes, name) && !taken[name]:
			ext, taken[name] = append(ext, CloudEventAttribute{name, v}), true
		default:
			if e.Other == nil {
				e.Other = Headers{}
			}
			e.Other[k] = v
		}
	}
	slices.SortFunc(ext, func(a, b CloudEventAttribute) int { return strings.Compare(a.Name, b.Name) })
	e.Attributes = append(e.Attributes, ext...)
	return e, nil
}

// ValidCloudEventsName reports whether name can be a CloudEvents attribute name: 1 to 20
// lowercase ASCII letters and digits.
func ValidCloudEventsName(name string) bool {
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
func (e CloudEvent) Attribute(name string) (string, bool) {
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

// JSON returns the event in the CloudEvents JSON format, with data as the payload: the
// JSON value itself when DataContentType is a JSON media type (application/json, text/json
// or any "+json" type), else the payload's text as a JSON string, so that a consumer's
// data is the payload byte for byte either way.
func (e CloudEvent) JSON(payload []byte) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(len(payload) + 256)
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
	switch {
	case jsonMediaType(e.DataContentType) && validJSON(payload):
		field("data", payload)
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

// jsonMediaType reports whether a content type declares JSON data, as the CloudEvents JSON
// format defines it.
func jsonMediaType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}
