package cloudevents_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/cloudevents"
)

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	var none *cloudevents.Options
	require.NoError(t, none.Validate())
	require.NoError(t, (&cloudevents.Options{Source: "https://shop.example/orders"}).Validate())
	require.NoError(t, (&cloudevents.Options{Source: "/shop", Mode: cloudevents.Structured}).Validate())
	for name, c := range map[string]cloudevents.Options{
		"no source":    {},
		"bad source":   {Source: "has space"},
		"bad uri":      {Source: "http://[::1"},
		"unknown mode": {Source: "/shop", Mode: 7},
	} {
		err := c.Validate()
		require.ErrorIs(t, err, outbox.ErrInvalid, name)
		var ve *outbox.ValidationError
		require.ErrorAs(t, err, &ve, name)
	}
}

func TestOf(t *testing.T) {
	t.Parallel()
	created := time.Date(2025, 3, 4, 5, 6, 7, 890_000_000, time.FixedZone("x", 3600))
	d := outbox.Delivery{
		ID: uuid.MustParse("0196a3c4-0000-7000-8000-000000000001"), Namespace: "shop", Topic: "order.created",
		PartitionKey: "order-1", CreatedAt: created, Payload: json.RawMessage(`{"a":1}`),
		Headers: outbox.Headers{
			"Content-Type": "application/vnd.shop+json", "traceparent": "00-abc-def-01", "Subject": "order/1",
			"x-request-id": "r1", "id": "forged", "type": "forged", "averyveryverylongname1": "too long",
			"TraceState": "k=v",
		},
	}
	c := &cloudevents.Options{Source: "/shop"}
	e, err := cloudevents.Of(c, d)
	require.NoError(t, err)
	require.Equal(t, []cloudevents.Attribute{
		{"id", d.ID.String()}, {"source", "/shop"}, {"specversion", "1.0"}, {"type", "order.created"},
		{"time", "2025-03-04T04:06:07.89Z"},
		{"partitionkey", "order-1"}, {"subject", "order/1"}, {"traceparent", "00-abc-def-01"}, {"tracestate", "k=v"},
	}, e.Attributes)
	require.Equal(t, "application/vnd.shop+json", e.DataContentType)
	require.Equal(t, outbox.Headers{"x-request-id": "r1", "id": "forged", "type": "forged", "averyveryverylongname1": "too long"}, e.Other)

	// Type maps the type; no partition key, no time, no headers: none of those attributes.
	c.Type = func(d outbox.Delivery) string { return "com.example." + d.Topic }
	bare := outbox.Delivery{ID: d.ID, Topic: "t"}
	e, err = cloudevents.Of(c, bare)
	require.NoError(t, err)
	require.Equal(t, []cloudevents.Attribute{{"id", d.ID.String()}, {"source", "/shop"}, {"specversion", "1.0"}, {"type", "com.example.t"}}, e.Attributes)
	require.Equal(t, "application/json", e.DataContentType)
	require.Nil(t, e.Other)
	v, ok := e.Attribute("type")
	require.True(t, ok)
	require.Equal(t, "com.example.t", v)
	_, ok = e.Attribute("partitionkey")
	require.False(t, ok)

	c.Type = func(outbox.Delivery) string { return "" }
	_, err = cloudevents.Of(c, d)
	require.ErrorIs(t, err, outbox.ErrInvalid)
}

func TestValidName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{
		"traceparent": true, "a1": true, "abcdefghijklmnopqrst": true,
		"": false, "abcdefghijklmnopqrstu": false, "Trace": false, "x-id": false, "x_id": false, "é": false,
	} {
		require.Equal(t, want, cloudevents.ValidName(name), name)
	}
}

// The structured form is a JSON object with every attribute and the payload as data: the
// JSON value itself for application/json and text/json, the payload's bytes in data_base64
// for other JSON types, the payload's text as a string otherwise.
func TestEventJSON(t *testing.T) {
	t.Parallel()
	d := outbox.Delivery{ID: uuid.New(), Topic: "t", PartitionKey: "k", CreatedAt: time.Unix(1, 0), Headers: outbox.Headers{"traceparent": "tp"}}
	c := &cloudevents.Options{Source: "/s", Mode: cloudevents.Structured}
	for _, tc := range []struct {
		contentType, payload string
		member               string
		data                 any
	}{
		{"", `{"n":1,"s":"<é>"}`, "data", map[string]any{"n": 1.0, "s": "<é>"}},
		{"text/json; charset=utf-8", `[1,2]`, "data", []any{1.0, 2.0}},
		{"application/vnd.x+json; charset=utf-8", `[1, 2]`, "data_base64", "WzEsIDJd"},
		{"text/plain", `"quoted"`, "data", `"quoted"`},
	} {
		if tc.contentType != "" {
			d.Headers["content-type"] = tc.contentType
		}
		e, err := cloudevents.Of(c, d)
		require.NoError(t, err)
		b, err := e.JSON([]byte(tc.payload))
		require.NoError(t, err)
		var got map[string]any
		require.NoError(t, json.Unmarshal(b, &got), string(b))
		wantCT := tc.contentType
		if wantCT == "" {
			wantCT = "application/json"
		}
		require.Equal(t, map[string]any{
			"id": d.ID.String(), "source": "/s", "specversion": "1.0", "type": "t", "time": "1970-01-01T00:00:01Z",
			"partitionkey": "k", "traceparent": "tp", "datacontenttype": wantCT, tc.member: tc.data,
		}, got)
	}
}

// Optional whitespace goes; quoted values stay as they are.
func TestCompactMediaType(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"application/json":                     "application/json",
		"text/plain; charset=utf-8":            "text/plain;charset=utf-8",
		"text/plain ;\tcharset = utf-8":        "text/plain;charset=utf-8",
		`multipart/x; boundary="a b\" c"; q=1`: `multipart/x;boundary="a b\" c";q=1`,
	} {
		require.Equal(t, want, cloudevents.CompactMediaType(in), in)
	}
}
