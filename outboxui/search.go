package outboxui

import (
	"errors"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/outboxgo/outbox"
)

// searchTopics bounds how many known topics a dedupe-key search without a topic tries.
const searchTopics = 200

// searchData is what the search page shows.
type searchData struct {
	Q, Namespace, Topic string
	Results             []outbox.Record
	// Searched says where a dedupe key was looked for.
	Searched string
	Message  string
}

// search finds a row by id, or rows by dedupe key: in the namespace and topic given, or
// else in every (namespace, topic) the overview's counts know (those with live or dead
// rows, or among the most recently delivered), one probe of the dedupe index each.
func (u *ui) search(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := searchData{Q: strings.TrimSpace(q.Get("q")), Namespace: strings.TrimSpace(q.Get("ns")), Topic: strings.TrimSpace(q.Get("topic"))}
	ctx := r.Context()
	if d.Q == "" {
		u.render(w, r, http.StatusOK, "search", u.page(w, r, "search", "Search", d))
		return
	}
	if id, err := uuid.Parse(d.Q); err == nil && len(d.Q) == 36 {
		rec, err := u.store.Get(ctx, id)
		switch {
		case err == nil:
			http.Redirect(w, r, u.link("/message/"+rec.ID.String()), http.StatusSeeOther)
			return
		case !errors.Is(err, outbox.ErrNotFound):
			u.storeError(w, r, "searching", err)
			return
		}
		d.Message = "No row has this id; searched it as a dedupe key too."
	}
	type pair struct{ ns, topic string }
	var pairs []pair
	if d.Namespace != "" && d.Topic != "" {
		pairs = []pair{{d.Namespace, d.Topic}}
		d.Searched = "in " + d.Namespace + " / " + d.Topic
	} else {
		st, err := u.store.Stats(ctx, outbox.Scope{Namespace: d.Namespace})
		if err != nil {
			u.storeError(w, r, "searching", err)
			return
		}
		for _, t := range st.Topics {
			if (d.Topic == "" || t.Topic == d.Topic) && len(pairs) < searchTopics {
				pairs = append(pairs, pair{t.Namespace, t.Topic})
			}
		}
		d.Searched = "in the topics the overview counts; give a namespace and a topic to search one the overview does not list"
	}
	for _, p := range pairs {
		rec, err := u.store.GetByDedupeKey(ctx, p.ns, p.topic, d.Q)
		switch {
		case err == nil:
			d.Results = append(d.Results, rec)
		case errors.Is(err, outbox.ErrNotFound):
		default:
			u.storeError(w, r, "searching", err)
			return
		}
	}
	if len(d.Results) == 1 && d.Message == "" {
		http.Redirect(w, r, u.link("/message/"+d.Results[0].ID.String()), http.StatusSeeOther)
		return
	}
	u.render(w, r, http.StatusOK, "search", u.page(w, r, "search", "Search", d))
}
