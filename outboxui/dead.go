package outboxui

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// deadGroupsShown is how many causes the dead-letter page lists.
const deadGroupsShown = 20

// deadData is what the dead-letter page shows.
type deadData struct {
	Filter filter
	Groups outbox.DeadCauses
	Page   outbox.DeadPage
	Cursor string
	// FilterError says why the filter was refused ("" when it was not).
	FilterError string
}

func (u *ui) dead(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := parseFilter(q, time.Now())
	f.Cause = "" // a cause is chosen on this page, for a confirmation; it lists every cause
	d := deadData{Filter: f, Cursor: q.Get("cursor")}
	if err != nil {
		d.FilterError = err.Error()
		u.render(w, r, http.StatusBadRequest, "dead", u.page(w, r, "dead", "Dead letters", d))
		return
	}
	ctx := r.Context()
	if d.Groups, err = u.store.DeadCauses(ctx, outbox.DeadGroupsOptions{DeadFilter: f.Dead, Limit: deadGroupsShown}); err != nil {
		u.storeError(w, r, "grouping the dead letters", err)
		return
	}
	if d.Page, err = u.store.ListDead(ctx, outbox.ListDeadOptions{DeadFilter: f.Dead, Limit: u.o.PageSize, Cursor: d.Cursor}); err != nil {
		u.storeError(w, r, "listing the dead letters", err)
		return
	}
	u.render(w, r, http.StatusOK, "dead", u.page(w, r, "dead", "Dead letters", d))
}

// confirmData is what a confirmation page shows: the action, how many rows, and the form
// that carries it out.
type confirmData struct {
	Action string // "replay" or "discard"
	Count  int64
	// Filter is the filter pinned to the rows counted (bulk), or empty (selected ids).
	Filter filter
	IDs    []uuid.UUID
	// Back is the link of the page to go back to; BackPath the same without the prefix,
	// which the form carries; UntilWas the filter's own Until, before it was pinned.
	Back, BackPath, UntilWas string
}

// confirmFilter shows how many dead rows a filter selects now and asks to replay or
// discard them all. Its form pins the filter to those rows: ages become times, and Until
// stops just after the newest death counted.
func (u *ui) confirmFilter(w http.ResponseWriter, r *http.Request) {
	if u.o.ReadOnly {
		u.fail(w, r, http.StatusForbidden, "refused: this view is read-only. Nothing was changed.", nil)
		return
	}
	q := r.URL.Query()
	action := q.Get("action")
	if action != "replay" && action != "discard" {
		u.fail(w, r, http.StatusBadRequest, "the action must be replay or discard", nil)
		return
	}
	f, err := parseFilter(q, time.Now())
	if err != nil {
		u.fail(w, r, http.StatusBadRequest, "the filter is not valid: "+err.Error(), nil)
		return
	}
	count, newest, err := u.countDead(r.Context(), f)
	if err != nil {
		u.storeError(w, r, "counting the dead letters", err)
		return
	}
	d := confirmData{Action: action, Count: count, Filter: f.Pinned(newest), Back: u.link("/dead?" + f.Query()), UntilWas: f.Until}
	u.render(w, r, http.StatusOK, "confirm", u.page(w, r, "dead", "Confirm "+action, d))
}

// countDead counts the dead rows f selects, its cause's when it names one, and returns
// the newest death among them.
func (u *ui) countDead(ctx context.Context, f filter) (int64, time.Time, error) {
	if f.Cause == "" {
		g, err := u.store.DeadGroups(ctx, outbox.DeadGroupsOptions{DeadFilter: f.Dead, Limit: 1})
		return g.Total, g.Newest, err
	}
	c, err := u.store.DeadCauses(ctx, outbox.DeadGroupsOptions{DeadFilter: f.Dead, Limit: outbox.MaxBatch})
	for _, cause := range c.Causes {
		if cause.Fingerprint == f.Cause {
			return cause.Count, cause.LastDied, err
		}
	}
	return 0, time.Time{}, err
}

// actBulk replays or discards every dead row of a pinned filter, after the confirmation.
func (u *ui) actBulk(w http.ResponseWriter, r *http.Request) {
	if !u.allowAction(w, r) {
		return
	}
	action := r.PostForm.Get("action")
	f, err := parseFilter(r.PostForm, time.Now())
	if err != nil {
		u.fail(w, r, http.StatusBadRequest, "the filter is not valid: "+err.Error()+". Nothing was changed.", nil)
		return
	}
	if f.Dead.Until.IsZero() {
		// Only a confirmation page's form reaches here, and it always pins Until.
		u.fail(w, r, http.StatusBadRequest, "a bulk action needs the confirmation page's bound (until). Nothing was changed.", nil)
		return
	}
	var n int64
	_, byCause := r.PostForm["cause"]
	switch {
	case action == "replay" && byCause:
		n, err = u.store.ReplayCause(r.Context(), f.Dead, f.Cause)
	case action == "discard" && byCause:
		n, err = u.store.DiscardCause(r.Context(), f.Dead, f.Cause)
	case action == "replay":
		n, err = u.store.ReplayWhere(r.Context(), f.Dead)
	case action == "discard":
		n, err = u.store.DiscardWhere(r.Context(), f.Dead)
	default:
		u.fail(w, r, http.StatusBadRequest, "the action must be replay or discard. Nothing was changed.", nil)
		return
	}
	if err != nil {
		u.storeError(w, r, fmt.Sprintf("%s (after %d rows)", action, n), err)
		return
	}
	// Back to the list with the filter as the operator wrote it, without the pinned bound.
	back := f.values()
	back.Del("until")
	back.Del("cause")
	if u := r.PostForm.Get("until_was"); u != "" {
		back.Set("until", u)
	}
	u.redirect(w, r, "/dead?"+merge(back, doneQuery(action+"ed", int(n), 0)).Encode())
}

// actSelected replays the rows selected on a page at once, and asks before discarding
// them.
func (u *ui) actSelected(w http.ResponseWriter, r *http.Request) {
	if !u.allowAction(w, r) {
		return
	}
	var ids []uuid.UUID
	for _, s := range r.PostForm["id"] {
		id, err := uuid.Parse(s)
		if err != nil {
			u.fail(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not a row id. Nothing was changed.", s), nil)
			return
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		u.fail(w, r, http.StatusBadRequest, "no row was selected. Nothing was changed.", nil)
		return
	}
	back := r.PostForm.Get("back")
	if back == "" || back[0] != '/' || (len(back) > 1 && (back[1] == '/' || back[1] == '\\')) {
		back = "/dead"
	}
	switch action := r.PostForm.Get("action"); {
	case action == "replay":
		res, err := u.store.Replay(r.Context(), ids...)
		if err != nil {
			u.storeError(w, r, "replay", err)
			return
		}
		u.redirect(w, r, withQuery(back, doneQuery("replayed", len(res.Replayed), len(res.Skipped))))
	case action == "discard" && r.PostForm.Get("confirmed") == "yes":
		res, err := u.store.Discard(r.Context(), ids...)
		if err != nil {
			u.storeError(w, r, "discard", err)
			return
		}
		u.redirect(w, r, withQuery(back, doneQuery("discarded", len(res.Discarded), len(res.Skipped))))
	case action == "discard":
		if len(ids) > outbox.MaxBatch {
			u.fail(w, r, http.StatusBadRequest, fmt.Sprintf("at most %d rows at once. Nothing was changed.", outbox.MaxBatch), nil)
			return
		}
		d := confirmData{Action: "discard", Count: int64(len(ids)), IDs: ids, Back: u.link(back), BackPath: back}
		u.render(w, r, http.StatusOK, "confirm", u.page(w, r, "dead", "Confirm discard", d))
	default:
		u.fail(w, r, http.StatusBadRequest, "the action must be replay or discard. Nothing was changed.", nil)
	}
}

// withQuery adds v to the query of the handler path p.
func withQuery(p string, v url.Values) string {
	pu, err := url.Parse(p)
	if err != nil {
		return "/dead?" + v.Encode()
	}
	pu.RawQuery = merge(pu.Query(), v).Encode()
	return pu.String()
}

// merge returns a's values overwritten by b's, without the notice of an earlier action.
func merge(a, b url.Values) url.Values {
	out := url.Values{}
	for k, vs := range a {
		if k == "done" || k == "n" || k == "skipped" {
			continue
		}
		out[k] = vs
	}
	for k, vs := range b {
		out[k] = vs
	}
	return out
}
