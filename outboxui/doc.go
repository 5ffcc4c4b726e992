// Package outboxui is a web view of an outbox table that a service mounts on its own HTTP
// server: an overview of the backlog, the dead letters grouped by error with replay and
// discard, one message in full, and a search by id or dedupe key.
//
//	ui := outboxui.Handler(store, outboxui.Options{Prefix: "/outbox"})
//	mux.Handle("/outbox/", requireOperator(ui)) // your service's own authentication
//
// The pages are rendered on the server with html/template, with their stylesheet and a
// small optional script embedded in the binary: no build step, nothing fetched from
// elsewhere, and every page and action works with JavaScript off.
//
// The handler has no authentication of its own: mount it behind the middleware that
// guards your service's other operator pages. What it does protect against is a page on
// another site driving an operator's browser: state changes are POST only, refused when
// the browser says the request crossed origins ([http.CrossOriginProtection]) and unless
// they carry a token bound to a cookie of the handler's, and the bulk actions (every row
// of a filter or a group, a discard) go through a confirmation page that states how many
// rows they touch. [Options.ReadOnly] hides every action and refuses them;
// [Options.HidePayloads] shows sizes instead of payloads. Everything shown is escaped.
//
// The pages read only through the operations API of [outbox.Store] (Stats, Activity,
// BlockedKeys, DeadGroups, ListDead, Get, GetByDedupeKey), which reads the claim,
// retention and dedupe indexes: the overview's cost does not grow with the delivered rows
// a table retains.
package outboxui
