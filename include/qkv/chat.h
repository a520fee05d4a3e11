// A multi-turn conversation with an instruction-tuned model in the ChatML format (SmolLM2,
// Qwen, …): each turn is <|im_start|>{role}\n{content}<|im_end|>\n, and the model answers
// after <|im_start|>assistant\n until it draws <|im_end|>. The key/value cache is kept from
// turn to turn, so each turn runs only its own new tokens through the model.
#pragma once

#include <cstdint>
#include <optional>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qkv/generate.h"
#include "qkv/kv_cache.h"
#include "qkv/model.h"
#include "qkv/tokenizer.h"

namespace qkv {

enum class ChatFormat { chatml };

// The format a chat template (GGUF's tokenizer.chat_template, a Jinja text) writes. Throws
// qkv::Error naming the template when it is empty or not one qkv knows.
ChatFormat chat_format(const std::string& chat_template);
// The system prompt the template puts first when the conversation has none ("" if none).
std::string default_system_prompt(const std::string& chat_template);

struct ChatOptions {
  std::string system;  // the system prompt; "" = none
  SamplingOptions sampling;
  int64_t max_reply = 1024;  // tokens per answer, at most
  int64_t context = 0;       // positions the cache holds, all turns together; 0 = the model's
  CacheType cache = CacheType::f32;
  std::optional<CacheType> cache_k, cache_v;  // (KVCacheOptions::key_type, value_type)
  CacheRotation cache_rotation = CacheRotation::automatic;  // (KVCacheOptions::rotation)
  CacheScores cache_scores = CacheScores::int8;             // (KVCacheOptions::scores)
};

struct ChatTurnStats {
  int64_t prompt_tokens = 0, reply_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  bool finished = true;  // false: stopped at max_reply (or by on_token)
};

class Chat {
 public:
  // The model and tokenizer must outlive the chat. The tokenizer must have ChatML's
  // <|im_start|> and <|im_end|> tokens.
  Chat(Model& model, const Tokenizer& tokenizer, ChatFormat format, const ChatOptions& options);
  ~Chat();

  // Adds the user's message, then streams the answer: on_token(text) for each token's bytes
  // (returning false stops it). Throws qkv::Error, the conversation unchanged, when the turn
  // would not fit in the context that is left.
  ChatTurnStats reply(const std::string& user,
                      const std::function<bool(const std::string&)>& on_token);
  // The same in two steps: add() puts a message of any role in the conversation (an earlier
  // exchange, a few-shot example) without running it; respond() runs what was added and
  // streams the assistant's answer.
  void add(const std::string& role, const std::string& content);
  ChatTurnStats respond(const std::function<bool(const std::string&)>& on_token);
  // Forgets the conversation (the system prompt stays).
  void reset();

  int64_t positions() const;  // run so far, all turns
  int64_t context() const { return context_; }
  // Every token of the conversation so far, run or still to run.
  std::vector<int32_t> transcript() const;
  // The tokens of one message as the format writes it (its text is not parsed for control
  // tokens: a user who types "<|im_end|>" does not end the turn).
  std::vector<int32_t> message_tokens(const std::string& role, const std::string& content) const;

 private:
  Model* model_;
  const Tokenizer* tokenizer_;
  ChatOptions options_;
  int64_t context_ = 0;
  int32_t start_ = -1, end_ = -1;  // <|im_start|>, <|im_end|>
  std::vector<int32_t> run_;       // the tokens in the cache
  std::vector<int32_t> pending_;  // decided but not yet run (added messages, the last <|im_end|>\n)
  std::unique_ptr<KVCache> cache_;
  Sampler sampler_;
};

}  // namespace qkv
