// Chat (include/qkv/chat.h): ChatML turns over a key/value cache kept between them.
#include "qkv/chat.h"

#include "qkv/clock.h"
#include "qkv/error.h"

namespace qkv {

ChatFormat chat_format(const std::string& t) {
  check(!t.empty(), "chat: the model has no chat template (tokenizer.chat_template)");
  if (t.find("<|im_start|>") != std::string::npos && t.find("<|im_end|>") != std::string::npos)
    return ChatFormat::chatml;
  fail(
      "chat: the chat template is not one qkv knows (it reads ChatML, with <|im_start|> and "
      "<|im_end|>); it begins \"",
      t.substr(0, 80), t.size() > 80 ? "…" : "", "\"");
}

std::string default_system_prompt(const std::string& t) {
  const std::string open = "<|im_start|>system\n";
  const size_t at = t.find(open);
  if (at == std::string::npos) return {};
  const size_t begin = at + open.size(), end = t.find("<|im_end|>", begin);
  if (end == std::string::npos) return {};
  const std::string s = t.substr(begin, end - begin);
  // Only a literal prompt: a template that writes messages[0]['content'] there has none.
  return s.find_first_of("{}'\"+") == std::string::npos ? s : std::string();
}

Chat::Chat(Model& model, const Tokenizer& tokenizer, ChatFormat, const ChatOptions& options)
    : model_(&model), tokenizer_(&tokenizer), options_(options), sampler_(options.sampling) {
  const ModelConfig& c = model.config();
  start_ = tokenizer.token_id("<|im_start|>");
  end_ = tokenizer.token_id("<|im_end|>");
  check(start_ >= 0 && end_ >= 0, "chat: the tokenizer has no <|im_start|> or <|im_end|> token");
  check(tokenizer.vocab_size() <= c.vocab_size, "chat: the tokenizer's ", tokenizer.vocab_size(),
        " tokens do not fit the model's vocabulary of ", c.vocab_size);
  check(options.max_reply >= 1, "chat: max_reply must be at least 1, got ", options.max_reply);
  check(options.context >= 0, "chat: context must be >= 0, got ", options.context);
  context_ = options.context == 0 || options.context > c.context ? c.context : options.context;
  reset();
}

Chat::~Chat() = default;

void Chat::reset() {
  cache_ = std::make_unique<KVCache>(model_->config(),
                                     KVCacheOptions{.max_seq = context_,
                                                    .type = options_.cache,
                                                    .key_type = options_.cache_k,
                                                    .value_type = options_.cache_v,
                                                    .rotation = options_.cache_rotation,
                                                    .scores = options_.cache_scores});
  pending_.clear();
  run_.clear();
  if (tokenizer_->adds_bos()) pending_.push_back(tokenizer_->bos());
  if (!options_.system.empty()) {
    const std::vector<int32_t> s = message_tokens("system", options_.system);
    check(static_cast<int64_t>(s.size()) < context_, "chat: the system prompt's ", s.size(),
          " tokens do not fit in the context of ", context_);
    pending_.insert(pending_.end(), s.begin(), s.end());
  }
}

int64_t Chat::positions() const { return cache_->length(0); }

std::vector<int32_t> Chat::message_tokens(const std::string& role,
                                          const std::string& content) const {
  std::vector<int32_t> ids{start_};
  const std::vector<int32_t> text =
      tokenizer_->encode(role + "\n" + content, /*bos=*/false, /*special=*/false);
  ids.insert(ids.end(), text.begin(), text.end());
  ids.push_back(end_);
  const std::vector<int32_t> nl = tokenizer_->encode("\n", false, false);
  ids.insert(ids.end(), nl.begin(), nl.end());
  return ids;
}

std::vector<int32_t> Chat::transcript() const {
  std::vector<int32_t> all = run_;
  all.insert(all.end(), pending_.begin(), pending_.end());
  return all;
}

void Chat::add(const std::string& role, const std::string& content) {
  const std::vector<int32_t> m = message_tokens(role, content);
  pending_.insert(pending_.end(), m.begin(), m.end());
}

ChatTurnStats Chat::reply(const std::string& user,
                          const std::function<bool(const std::string&)>& on_token) {
  const size_t before = pending_.size();
  add("user", user);
  try {
    return respond(on_token);
  } catch (const Error&) {
    pending_.resize(before);
    throw;
  }
}

ChatTurnStats Chat::respond(const std::function<bool(const std::string&)>& on_token) {
  std::vector<int32_t> prompt = pending_;
  prompt.push_back(start_);
  const std::vector<int32_t> a = tokenizer_->encode("assistant\n", false, false);
  prompt.insert(prompt.end(), a.begin(), a.end());
  const int64_t room = context_ - positions();
  check(static_cast<int64_t>(prompt.size()) < room, "chat: this turn's ", prompt.size(),
        " tokens do not fit in the ", room, " positions left of the context (", context_,
        "): start over (reset) or give a larger context");

  ChatTurnStats s;
  s.prompt_tokens = static_cast<int64_t>(prompt.size());
  const int64_t V = model_->config().vocab_size;
  const double t0 = now_seconds();
  View logits = model_->forward_cached(*cache_, prompt.data(), 1, s.prompt_tokens);
  s.prefill_seconds = now_seconds() - t0;
  run_.insert(run_.end(), prompt.begin(), prompt.end());
  pending_.clear();
  const double t1 = now_seconds();
  int32_t prev = -1;
  s.finished = false;
  for (;;) {
    const int32_t token = sampler_.sample(logits.data, V);
    if (token == end_ || token == tokenizer_->eos()) {
      s.finished = true;
      break;
    }
    ++s.reply_tokens;
    run_.push_back(token);
    const bool more = !on_token || on_token(tokenizer_->decode(prev, token));
    prev = token;
    // The answer ends at max_reply, or when only its closing tokens still fit.
    if (!more || s.reply_tokens >= options_.max_reply || positions() + 4 >= context_) {
      run_.pop_back();  // drawn, not run
      pending_.push_back(token);
      break;
    }
    logits = model_->forward_cached(*cache_, &token, 1, 1);
  }
  // The turn closes as the template writes it; those tokens run with the next turn.
  pending_.push_back(end_);
  const std::vector<int32_t> nl = tokenizer_->encode("\n", false, false);
  pending_.insert(pending_.end(), nl.begin(), nl.end());
  s.decode_seconds = now_seconds() - t1;
  return s;
}

}  // namespace qkv
