-- One event with a full envelope: a type, a key and a W3C traceparent header.
SELECT streams.publish('payment.success', '{"order_id":"ord_123","amount":49.00}',
                       type => 'payment.succeeded', key => 'ord_123',
                       headers => '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}');
