package outboxui

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// messageData is what the message page shows.
type messageData struct {
	Rec outbox.Record
	// Headers are the row's headers, sorted by name.
	Headers [][2]string
	// Payload is the payload as shown: pretty-printed when it is JSON (it always is, unless
	// the row was damaged), cut at PayloadView bytes; Cut says it was.
	Payload     string
	PayloadSize int
	Cut         bool
	// Integrity is why the row fails its integrity check ("" when it passes).
	Integrity string
	Back      string
}

// rowID reads the {id} of the path, answering for a bad one.
func (u *ui) rowID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		u.fail(w, r, http.StatusBadRequest, "the address does not name a row: its id is not a UUID", nil)
		return uuid.Nil, false
	}
	return id, true
}

func (u *ui) message(w http.ResponseWriter, r *http.Request) {
	id, ok := u.rowID(w, r)
	if !ok {
		return
	}
	rec, err := u.store.Get(r.Context(), id)
	if errors.Is(err, outbox.ErrNotFound) {
		u.fail(w, r, http.StatusNotFound, "no row has the id "+id.String()+" (it may have been purged or discarded).", nil)
		return
	}
	if err != nil {
		u.storeError(w, r, "reading the row", err)
		return
	}
	d := messageData{Rec: rec, PayloadSize: len(rec.Payload), Back: "/message/" + id.String()}
	for k, v := range rec.Headers {
		d.Headers = append(d.Headers, [2]string{k, v})
	}
	slices.SortFunc(d.Headers, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	if err := rec.Integrity(); err != nil {
		d.Integrity = err.Error()
	}
	if !u.o.HidePayloads {
		d.Payload, d.Cut = pretty(rec.Payload, u.o.PayloadView)
	}
	rec.Payload = nil // the template shows d.Payload only
	d.Rec = rec
	u.render(w, r, http.StatusOK, "message", u.page(w, r, "", "Message", d))
}

// maxIndent bounds the payloads pretty-printed; larger ones are shown as stored.
const maxIndent = 16 << 20

// pretty indents a JSON payload (or keeps other bytes as they are) and cuts it at limit
// bytes, on a rune boundary.
func pretty(payload []byte, limit int) (string, bool) {
	var b bytes.Buffer
	src := payload
	if len(payload) <= maxIndent && json.Indent(&b, payload, "", "  ") == nil {
		src = b.Bytes()
	}
	s := strings.ToValidUTF8(string(src), "\uFFFD")
	if len(s) <= limit {
		return s, false
	}
	n := limit
	for n > 0 && (s[n]&0xC0) == 0x80 {
		n--
	}
	return s[:n], true
}

// payload serves a row's payload whole, as a download.
func (u *ui) payload(w http.ResponseWriter, r *http.Request) {
	id, ok := u.rowID(w, r)
	if !ok {
		return
	}
	if u.o.HidePayloads {
		u.fail(w, r, http.StatusForbidden, "payloads are hidden in this view", nil)
		return
	}
	rec, err := u.store.Get(r.Context(), id)
	if err != nil {
		u.storeError(w, r, "reading the row", err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Disposition", `attachment; filename="`+id.String()+`.json"`)
	h.Set("Cache-Control", "no-store")
	_, _ = w.Write(rec.Payload)
}
