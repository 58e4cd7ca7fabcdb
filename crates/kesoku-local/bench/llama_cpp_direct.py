"""llama.cpp in-process (llama-cpp-python, no HTTP server), timed by llama.cpp's own counters.

Same prompts as benches/local_model.rs; prints one Markdown table row. Used by bench/run.sh:
    python llama_cpp_direct.py MODEL.gguf THREADS TOKENS RUNS
"""
import sys

import llama_cpp
from llama_cpp import Llama


def chat_prompt(run, user):
    return (f"<|im_start|>system\nRun {run}. You are a helpful assistant.<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def long_question():
    text = "Read these notes and summarise them in one sentence.\n"
    for i in range(24):
        text += (f"Note {i}: the warehouse in district {i % 7} received {10 + i * 3} crates of apples, "
                 f"{5 + i} of pears and a late delivery of tools.\n")
    return text


def measure(llm, prompt, max_tokens):
    llama_cpp.llama_perf_context_reset(llm.ctx)
    llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0)
    perf = llama_cpp.llama_perf_context(llm.ctx)
    prompt_rate = perf.n_p_eval / (perf.t_p_eval_ms / 1000) if perf.t_p_eval_ms else 0.0
    generation_rate = perf.n_eval / (perf.t_eval_ms / 1000) if perf.t_eval_ms else 0.0
    return prompt_rate, generation_rate, perf.n_eval + 1


def main():
    model, threads, tokens, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=4096, verbose=False)
    measure(llm, chat_prompt(10**9, "Hello"), 8)
    best_prompt, best_generation, generated = 0.0, 0.0, 0
    for run in range(runs):
        _, generation_rate, n = measure(llm, chat_prompt(run, "Count from 1 to 200, separated by commas."), tokens)
        prompt_rate, _, _ = measure(llm, chat_prompt(run + 1000, long_question()), 8)
        best_prompt, best_generation = max(best_prompt, prompt_rate), max(best_generation, generation_rate)
        generated = max(generated, n)
    print(f"| llama.cpp in-process (llama-cpp-python, its own timers, no HTTP) "
          f"| {best_prompt:.1f} | {best_generation:.1f} | {generated} |")


if __name__ == "__main__":
    main()
