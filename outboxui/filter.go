package outboxui

import (
	"fmt"
	"html/template"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
	"github.com/outboxgo/outbox/internal/when"
)

// filter is the dead-letter filter of a request, as the form gave it (Fields, echoed back
// into the form and the links) and as the store takes it (Dead).
//
// Group selects the rows whose last error is exactly it; Cause those whose last error has
// that fingerprint (outbox.ErrorFingerprint), which the store acts on by its texts and
// which is not part of Dead.
type filter struct {
	Namespace, Topic, Tenant, Error, Group, Cause, Since, Until string
	Dead                                                        outbox.DeadFilter
}

// filterKeys are the query keys of a filter, in the order links write them.
var filterKeys = []string{"ns", "topic", "tenant", "error", "group", "cause", "since", "until"}

// parseFilter reads a filter from q. Since and Until are times (RFC 3339, or a date, as
// UTC midnight) or ages before now (90m, 72h, 7d). A bad value returns an error that says
// which field; the store validates the rest (lengths, UTF-8).
func parseFilter(q url.Values, now time.Time) (filter, error) {
	f := filter{
		Namespace: strings.TrimSpace(q.Get("ns")), Topic: strings.TrimSpace(q.Get("topic")),
		Tenant: strings.TrimSpace(q.Get("tenant")), Error: q.Get("error"), Group: q.Get("group"), Cause: q.Get("cause"),
		Since: strings.TrimSpace(q.Get("since")), Until: strings.TrimSpace(q.Get("until")),
	}
	d := outbox.DeadFilter{Scope: outbox.Scope{Namespace: f.Namespace}, ErrorContains: f.Error, LastError: f.Group}
	if _, set := q["cause"]; set && f.Group != "" {
		return f, fmt.Errorf("choose a cause or one error text (group), not both")
	}
	if f.Topic != "" {
		d.Topics = []string{f.Topic}
	}
	if f.Tenant != "" {
		id, err := uuid.Parse(f.Tenant)
		if err != nil {
			return f, fmt.Errorf("tenant %q is not a UUID", f.Tenant)
		}
		d.TenantID = id
	}
	var err error
	if d.Since, err = when.Parse(f.Since, now); err != nil {
		return f, fmt.Errorf("died after: %w", err)
	}
	if d.Until, err = when.Parse(f.Until, now); err != nil {
		return f, fmt.Errorf("died before: %w", err)
	}
	if !d.Since.IsZero() && !d.Until.IsZero() && !d.Since.Before(d.Until) {
		return f, fmt.Errorf("died after (%s) must be before died before (%s)", fmtTime(d.Since), fmtTime(d.Until))
	}
	f.Dead = d
	return f, nil
}

// values returns the filter as query values, empty fields left out.
func (f filter) values() url.Values {
	v := url.Values{}
	for i, s := range []string{f.Namespace, f.Topic, f.Tenant, f.Error, f.Group, f.Cause, f.Since, f.Until} {
		if s != "" {
			v.Set(filterKeys[i], s)
		}
	}
	return v
}

// Query is the filter as a query string, without "?".
func (f filter) Query() string { return f.values().Encode() }

// Q returns the filter's query string with each key of the pairs kv set to its value (or
// removed when it is ""), for the templates' links. url.Values encodes every byte that
// could end the attribute or the URL, so the result is safe as a URL.
func (f filter) Q(kv ...string) template.URL {
	v := f.values()
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			v.Del(kv[i])
		} else {
			v.Set(kv[i], kv[i+1])
		}
	}
	return template.URL(v.Encode())
}

// Pinned returns the filter with its ages turned into the times they stand for now and
// Until set just after newest (when it is earlier than the filter's own), so that a
// confirmed action touches exactly the rows the confirmation counted.
func (f filter) Pinned(newest time.Time) filter {
	p := f
	if !f.Dead.Since.IsZero() {
		p.Since = f.Dead.Since.Format(time.RFC3339Nano)
	}
	until := newest.Add(time.Microsecond)
	if !f.Dead.Until.IsZero() && f.Dead.Until.Before(until) {
		until = f.Dead.Until
	}
	if !newest.IsZero() || !f.Dead.Until.IsZero() {
		p.Until = until.UTC().Format(time.RFC3339Nano)
		p.Dead.Until = until
	}
	return p
}

// Active reports whether any field is set.
func (f filter) Active() bool { return len(f.values()) > 0 }
