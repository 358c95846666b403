"""A stand-in for a vLLM server's /metrics: a real HTTP server answering the page a test sets, in
vLLM 0.32's format (tests/test_vllm.py reads real servers)."""

import http.server
import threading
import time


def metrics_page(drafts=0, accepted_by_position=(0, 0, 0), generated=0, running=0, waiting=0, started=1.7e9,
                 engines=1, speculative=True) -> str:
    """A /metrics page as vLLM 0.32 writes it (the lines that matter, and others around them),
    the counts split over `engines` engines of a data-parallel server."""
    lines = ["# HELP python_gc_objects_collected_total Objects collected during gc",
             "# TYPE python_gc_objects_collected_total counter",
             'python_gc_objects_collected_total{generation="0"} 1234.0',
             f"process_start_time_seconds {started}"]
    for engine in range(engines):
        labels = f'engine="{engine}",model_name="smollm2 {{a}}, \\"b\\""'
        share = lambda value: value / engines
        lines += [f"vllm:num_requests_running{{{labels}}} {share(running)}",
                  f"vllm:num_requests_waiting{{{labels}}} {share(waiting)}",
                  f"vllm:generation_tokens_total{{{labels}}} {share(generated)}",
                  f"vllm:generation_tokens_created{{{labels}}} 1.7e9"]
        if speculative:
            lines += [f"vllm:spec_decode_num_drafts_total{{{labels}}} {share(drafts)}",
                      f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} "
                      f"{share(drafts * len(accepted_by_position))}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {share(sum(accepted_by_position))}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{d}"}} {share(a)}'
                      for d, a in enumerate(accepted_by_position)]
    return "\n".join(lines) + "\n"


class MetricsServer:
    """A real HTTP server answering /metrics with whatever the test sets."""

    def __init__(self):
        self.text, self.status, self.requests = metrics_page(), 200, 0
        self.delay_s = 0.0   # how long each answer takes
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                owner.requests += 1
                time.sleep(owner.delay_s)
                body = owner.text.encode()
                self.send_response(owner.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
