// Package cloudevents makes a transport send each outbox message as a CloudEvents 1.0 event
// (https://cloudevents.io). A transport maps an [outbox.Delivery] to an [Event] with [Of]
// and sends it in the [Binary] mode (the payload as it is, the attributes as the broker's
// headers) or the [Structured] mode (the whole event as one JSON document, [Event.JSON]).
//
// Users meet the package through a transport's options: every transport module takes an
// [Options] as its Options.CloudEvents, and nil, the default, sends messages as plain
// outbox messages. For example, with the NATS transport:
//
//	tr, err := outboxnats.New(js, outboxnats.Options{
//		CloudEvents: &cloudevents.Options{
//			Source: "https://shop.example/orders",
//			Mode:   cloudevents.Structured, // default: cloudevents.Binary
//		},
//	})
//
// A transport of your own calls [Options.Validate] in its constructor and [Of] per message.
package cloudevents
