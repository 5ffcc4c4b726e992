package outboxui

import (
	"errors"
	"net/http"
	"time"

	"github.com/outboxgo/outbox"
)

// blockedKeysShown is how many blocked ordered keys the overview lists.
const blockedKeysShown = 20

// overviewData is what the overview shows.
type overviewData struct {
	Stats     outbox.Stats
	Activity  outbox.Activity
	Delivered chart
	Dead      chart
	Blocked   []outbox.BlockedKey
	// BlockedNote says why blocked keys are not listed ("" when they are).
	BlockedNote string
	// ActivityNote says why the chart is missing ("" when it is there).
	ActivityNote string
	Took         time.Duration
}

func (u *ui) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	start := time.Now()
	var d overviewData
	var err error
	if d.Stats, err = u.store.Stats(ctx, outbox.Scope{}); err != nil {
		u.storeError(w, r, "reading the counts", err)
		return
	}
	switch d.Activity, err = u.store.Activity(ctx, outbox.ActivityOptions{}); {
	case errors.Is(err, errors.ErrUnsupported):
		d.ActivityNote = "The store's dialect cannot count rows per minute."
	case err != nil:
		u.storeError(w, r, "reading the activity", err)
		return
	default:
		d.Delivered = newChart(d.Activity, func(m outbox.MinuteActivity) int64 { return m.Delivered }, "delivered")
		d.Dead = newChart(d.Activity, func(m outbox.MinuteActivity) int64 { return m.Dead }, "dead")
	}
	var ce *outbox.CheckError
	if d.Stats.Dead == 0 {
		// Only a dead head blocks a key: with no dead row there is nothing to look for.
		d.Took = time.Since(start)
		u.renderOverview(w, r, d)
		return
	}
	switch d.Blocked, err = u.store.BlockedKeys(ctx, outbox.Scope{}, blockedKeysShown); {
	case errors.Is(err, errors.ErrUnsupported):
		d.BlockedNote = "The store's dialect has no ordered delivery."
	case errors.As(err, &ce):
		d.BlockedNote = "Ordered delivery is not set up on this table (no order index), so no key can be blocked."
	case err != nil:
		u.storeError(w, r, "reading the blocked keys", err)
		return
	}
	d.Took = time.Since(start)
	u.renderOverview(w, r, d)
}

func (u *ui) renderOverview(w http.ResponseWriter, r *http.Request, d overviewData) {
	p := u.page(w, r, "overview", "Overview", d)
	if u.o.Refresh > 0 {
		p.Refresh = int(u.o.Refresh.Seconds())
	}
	u.render(w, r, http.StatusOK, "overview", p)
}
