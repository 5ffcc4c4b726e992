package outboxui

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxgo/outbox"
)

// DefaultDatabaseTimeout is how long the summary of [Databases] waits for each database
// when Options.DatabaseTimeout is zero.
const DefaultDatabaseTimeout = 3 * time.Second

// summaryParallel is how many databases the summary reads at once.
const summaryParallel = 16

// Database is one database of a view over several ([Databases]).
type Database struct {
	// Name identifies the database in the summary and in the address of its pages:
	// 1 to 64 letters, digits, '.', '_', '-' or '~', unique in the view.
	Name string
	// Detail, when set, is shown beside the name in the summary: where the database is,
	// such as its DSN without the password.
	Detail string
	// Store reads and acts on the database's table.
	Store *outbox.Store
	// Health, when set, reports the publisher that delivers the database's rows, for the
	// summary (see [RelayDatabases]).
	Health func() Health
}

// Health is what the summary shows of the publisher of a database.
type Health struct {
	// State is the publisher's word for its health, such as a Relay's "healthy", "down"
	// or "misconfigured"; "" when it has none.
	State string
	// CircuitOpen reports that the publisher's circuit breaker is open (deliveries paused
	// after an outage of the broker), since CircuitOpenedAt.
	CircuitOpen     bool
	CircuitOpenedAt time.Time
}

// RelayDatabases returns the databases of relay, named as they were added to it, with the
// relay's health of each: its state and the circuit the relay's stores share. stores are
// the same stores, by the same names; a store the relay does not know shows no health.
func RelayDatabases(relay *outbox.Relay, stores map[string]*outbox.Store) []Database {
	out := make([]Database, 0, len(stores))
	for name, s := range stores {
		out = append(out, Database{Name: name, Store: s, Health: func() Health {
			st := relay.Stats()
			ms, ok := st.Stores[name]
			if !ok {
				return Health{}
			}
			return Health{State: string(ms.State), CircuitOpen: st.Total.CircuitOpen, CircuitOpenedAt: st.Total.CircuitOpenedAt}
		}})
	}
	slices.SortFunc(out, func(a, b Database) int { return strings.Compare(a.Name, b.Name) })
	return out
}

var databaseName = regexp.MustCompile(`^[A-Za-z0-9._~-]{1,64}$`)

// Databases returns one web view over several databases: a summary row per database
// (pending, the oldest pending age, dead, and its publisher's state and circuit where
// Health reports them) at Prefix + "/", each database's name a link to its own pages, the
// same as [Handler]'s, under Prefix + "/db/" + Name. A database that does not answer within
// Options.DatabaseTimeout shows its error in its row; the others are shown as usual. Each
// database's pages read and act on its store alone. A name that is empty, repeated or
// holds other characters than [Database.Name] allows, or a nil store, is an error.
func Databases(dbs []Database, o Options) (http.Handler, error) {
	o = o.withDefaults()
	seen := map[string]bool{}
	for i, d := range dbs {
		switch {
		case !databaseName.MatchString(d.Name):
			return nil, fmt.Errorf("outboxui: database %d: name %q must be 1 to 64 letters, digits, '.', '_', '-' or '~'", i+1, d.Name)
		case seen[d.Name]:
			return nil, fmt.Errorf("outboxui: database %d: name %q is given twice", i+1, d.Name)
		case d.Store == nil:
			return nil, fmt.Errorf("outboxui: database %q has no store", d.Name)
		}
		seen[d.Name] = true
	}
	m := &multi{dbs: dbs, o: o, each: map[string]http.Handler{}}
	// The summary is served by a ui of its own, with no store.
	m.ui = &ui{o: o, pages: parsePages(), summary: true}
	for _, d := range dbs {
		po := o
		po.Prefix = o.Prefix + "/db/" + d.Name
		po.Title = d.Name
		m.each[d.Name] = newHandler(d.Store, po, o.Prefix+"/")
	}
	summary := http.NewServeMux()
	summary.HandleFunc("GET /{$}", m.summary)
	mux := http.NewServeMux()
	mux.Handle("/", m.ui.wrap(m.ui.assets(summary)))
	mux.HandleFunc(o.Prefix+"/db/{name}/", func(w http.ResponseWriter, r *http.Request) {
		h, ok := m.each[r.PathValue("name")]
		if !ok {
			m.ui.fail(w, r, http.StatusNotFound, "no database of that name", nil)
			return
		}
		h.ServeHTTP(w, r)
	})
	mux.HandleFunc(o.Prefix+"/db/{name}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Path+"/", http.StatusMovedPermanently)
	})
	// The summary's own assets and unknown addresses go to a prefix-stripping ui.
	return mux, nil
}

// multi serves the summary of several databases and routes to each one's pages.
type multi struct {
	dbs  []Database
	o    Options
	ui   *ui
	each map[string]http.Handler
}

// summaryRow is one database in the summary.
type summaryRow struct {
	Name   string
	Detail string
	Stats  outbox.Stats
	Health Health
	// HasHealth reports that a publisher reports the database's health.
	HasHealth bool
	// Error says why the counts could not be read ("" when they were).
	Error string
}

// summaryData is what the summary page shows.
type summaryData struct {
	Rows        []summaryRow
	Down        int
	Pending     int64
	Dead        int64
	OldestAge   time.Duration
	Took        time.Duration
	TimeoutNote time.Duration
}

func (m *multi) summary(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	d := summaryData{Rows: make([]summaryRow, len(m.dbs)), TimeoutNote: m.o.DatabaseTimeout}
	sem := make(chan struct{}, summaryParallel)
	var wg sync.WaitGroup
	for i, db := range m.dbs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			row := summaryRow{Name: db.Name, Detail: db.Detail}
			if db.Health != nil {
				row.Health, row.HasHealth = db.Health(), true
			}
			ctx, cancel := context.WithTimeout(r.Context(), m.o.DatabaseTimeout)
			defer cancel()
			st, err := db.Store.Stats(ctx, outbox.Scope{})
			if err != nil {
				row.Error = err.Error()
				if ctx.Err() != nil {
					row.Error = fmt.Sprintf("no answer within %s: %s", m.o.DatabaseTimeout, row.Error)
				}
			}
			row.Stats = st
			d.Rows[i] = row
		})
	}
	wg.Wait()
	for _, row := range d.Rows {
		if row.Error != "" {
			d.Down++
			continue
		}
		d.Pending += row.Stats.Pending
		d.Dead += row.Stats.Dead
		d.OldestAge = max(d.OldestAge, row.Stats.OldestUndeliveredAge)
	}
	d.Took = time.Since(start)
	p := m.ui.page(w, r, "summary", "Databases", d)
	p.Multi = true
	if m.o.Refresh > 0 {
		p.Refresh = int(m.o.Refresh.Seconds())
	}
	m.ui.render(w, r, http.StatusOK, "summary", p)
}
